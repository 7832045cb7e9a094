"""Sampling helpers around streaming inference: stream one prompt to MP4, load distilled weights, eval grids."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from flowrl.distill.causal_wan import CausalWan
from flowrl.distill.schedule import denoising_timesteps
from flowrl.distill.streaming import StreamChunk, StreamingDecoder, stream_video, summarize_stream


def to_uint8_frames(frames: Tensor):
    """(F, 3, H, W) float [0, 1] → (F, H, W, 3) uint8 numpy."""
    return (frames.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def load_student_weights(student: CausalWan, path: str, ema: bool = False) -> None:
    """Load a distillation checkpoint's student (or EMA) weights into ``student``."""
    from flowrl.checkpoint import load_checkpoint

    tensors, _ = load_checkpoint(path, map_location="cpu")
    student.transformer.load_state_dict(tensors["student"])
    if ema:
        params = [p for p in student.parameters() if p.requires_grad]
        with torch.no_grad():
            for i, p in enumerate(params):
                p.copy_(tensors["ema"][str(i)].to(p.dtype))


def write_stream(student: CausalWan, roles, cfg, prompts: list[str], out: str, seed: int = 0, fps: int = 16,
                 on_chunk: Callable[[StreamChunk], None] | None = None, frames_dir: str | None = None) -> dict:
    """Stream ``prompts[0]``'s video chunk by chunk (each chunk's frames handed to ``on_chunk`` / written as
    PNGs as soon as decoded) and write the whole video to ``out`` (MP4/GIF) at the end."""
    from flowrl.eval.media import save_png, save_video

    r = cfg.rollout
    device = next(student.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    c = student.transformer.config.in_channels
    noise = torch.randn(1, c, r.num_frames, r.height, r.width, generator=gen).to(device)
    with torch.no_grad():
        text = roles.text_encoder(prompts[:1]).to(device)
    chunks, frames = [], []
    for ch in stream_video(student, StreamingDecoder(roles.vae), noise, text, denoising_timesteps(r.steps),
                           r.renoise, gen):
        chunks.append(ch)
        frames.append(ch.frames[0])
        if frames_dir:
            Path(frames_dir).mkdir(parents=True, exist_ok=True)
            start = sum(f.shape[0] for f in frames[:-1])
            for j, img in enumerate(to_uint8_frames(ch.frames[0])):
                save_png(img, Path(frames_dir) / f"frame_{start + j:05d}.png")
        if on_chunk is not None:
            on_chunk(ch)
    video = to_uint8_frames(torch.cat(frames))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_video(video, out, fps=fps)
    return {**summarize_stream(chunks), "path": str(out), "prompt": prompts[0]}


def eval_grid(students: dict[str, CausalWan], roles, cfg, prompts: list[str], out: str, seed: int = 0) -> Path:
    """A video grid (rows = prompts, columns = models, e.g. {"init": ..., "distilled": ...}) via flowrl.eval."""
    from flowrl.eval.grid import make_grid
    from flowrl.eval.media import save_video

    r = cfg.rollout
    rows = []
    for i, p in enumerate(prompts):
        row = []
        for student in students.values():
            device = next(student.parameters()).device
            gen = torch.Generator().manual_seed(seed + i)
            noise = torch.randn(1, student.transformer.config.in_channels, r.num_frames, r.height, r.width,
                                generator=gen).to(device)
            with torch.no_grad():
                text = roles.text_encoder([p]).to(device)
            chunks = list(stream_video(student, StreamingDecoder(roles.vae), noise, text,
                                       denoising_timesteps(r.steps), r.renoise, gen))
            row.append(torch.cat([c.frames[0] for c in chunks]))
        rows.append(torch.stack(row))
    grid = make_grid(torch.stack(rows), row_labels=list(prompts), col_labels=list(students))
    return save_video(grid, out)
