"""Streaming inference: each chunk is denoised with the KV cache, decoded, and emitted at once.

Self-Forcing ``demo.py::generate_video_stream``: per block, run the few denoising steps
with the cache, the t = 0 cache update (skipped for the last block), decode only that block with a *cached
causal* VAE decoder, and hand its frames out while the next block is generated. Timing per chunk
(Self-Forcing ``CausalInferencePipeline.inference(profile=True)``):
latency = wall time from the start of the stream to that chunk's frames; FPS = decoded frames / total time.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from flowrl.distill.causal_wan import CausalWan
from flowrl.distill.components import latent_stats
from flowrl.distill.rollout import stream_chunks


class StreamingDecoder:
    """Decodes latent chunks one after another with ``AutoencoderKLWan``'s causal conv cache kept between
    calls, so the concatenated chunks equal one ``vae.decode`` of the whole video (Wan's decoder runs frame by
    frame with a feature cache; this keeps that cache alive across chunks instead of clearing it)."""

    def __init__(self, vae: nn.Module):
        if not hasattr(vae, "clear_cache") or not hasattr(vae, "decoder"):
            raise TypeError(f"StreamingDecoder needs an AutoencoderKLWan, got {type(vae).__name__}")
        self.vae = vae
        self.reset()

    def reset(self) -> None:
        self.vae.clear_cache()
        self._first = True

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Normalised latent chunk (B, C, f, H, W) → pixels (B, f', 3, H', W') in [0, 1]."""
        vae = self.vae
        mean, std = latent_stats(vae, latents)
        z = (latents * std + mean).to(vae.dtype)
        x = vae.post_quant_conv(z)
        outs = []
        for i in range(x.shape[2]):
            vae._conv_idx = [0]
            outs.append(vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx,
                                    first_chunk=self._first))
            self._first = False
        video = torch.cat(outs, dim=2).float().clamp(-1, 1)
        return ((video + 1) / 2).permute(0, 2, 1, 3, 4)


@dataclass
class StreamChunk:
    """One emitted chunk: its index, pixel frames (B, f', 3, H, W), latents, and timing."""

    index: int
    frames: Tensor
    latents: Tensor
    chunk_seconds: float      # generation + decode time of this chunk
    latency_seconds: float    # stream start → this chunk's frames available


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def stream_video(student: CausalWan, decoder: StreamingDecoder | None, noise: Tensor, text: Tensor,
                 timesteps: Tensor, renoise_kind: str = "sde", generator: torch.Generator | None = None
                 ) -> Iterator[StreamChunk]:
    """Yield chunks as soon as they are decoded (``decoder=None``: latents only, frames empty)."""
    if decoder is not None:
        decoder.reset()
    start = last = time.perf_counter()
    for k, x0 in enumerate(stream_chunks(student, noise, text, timesteps, renoise_kind=renoise_kind,
                                         generator=generator)):
        frames = decoder.decode(x0) if decoder is not None else x0.new_zeros(0)
        _sync(x0.device)
        now = time.perf_counter()
        yield StreamChunk(k, frames, x0, now - last, now - start)
        last = time.perf_counter()


def summarize_stream(chunks: list[StreamChunk]) -> dict:
    """Per-chunk latency/FPS summary: first-chunk latency, mean chunk time, total frames / total time."""
    frames = sum(c.frames.shape[1] for c in chunks if c.frames.numel())
    total = chunks[-1].latency_seconds if chunks else 0.0
    return {"chunks": len(chunks), "frames": frames, "first_chunk_latency_s": chunks[0].latency_seconds,
            "mean_chunk_s": sum(c.chunk_seconds for c in chunks) / len(chunks), "total_s": total,
            "fps": frames / total if total > 0 else float("nan"),
            "chunk_s": [round(c.chunk_seconds, 5) for c in chunks]}
