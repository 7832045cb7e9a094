"""RMD — Rollout-Marginal Distillation: score each generated chunk independently, then video-level DMD.

RMD (arXiv 2609.37925; ``cjeen/RMD: model/frame_dmd*.py``, ``configs/stage1.yaml``, ``configs/stage2.yaml``):

* stage 1 ("chunk"): the rollout keeps its self-generated history (the student is causal), but the video is
  split into score chunks of ``score_chunk_frames`` latent frames, each its own batch element with repeated text;
  the chunk teacher and chunk critic see one chunk alone:
      L_RMD = Σ_k w_k · ½‖x^k − sg(x^k − g^k(x^k | c))‖²,  w_k = |chunk k| / total
  (equal chunks ⇒ w_k = 1/n and L_RMD is the DMD loss on the chunk batch);
* stage 2 ("video"): standard video-level DMD restores temporal coherence.
* replay (RMD "memory-efficient replay"): the rollout runs without grad, recording each chunk's exit-step input;
  one teacher-forcing forward over ``[clean rollout | noisy exit inputs]`` then gives x̂ with grad.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

from flowrl.distill.causal_wan import CausalWan, x0_from_flow
from flowrl.distill.rollout import RolloutResult, chunk_slices


@dataclass
class Config:
    """RMD defaults: stage 1 = 900 iterations at chunk guidance 1.0, frame-wise score chunks (stage1.yaml)."""

    chunk_stage_iterations: int = 900     # then video-level DMD (stage2.yaml: 800 more iterations)
    score_chunk_frames: int = 1
    chunk_guidance_scale: float = 1.0
    chunk_teacher: str = ""               # diffusers Wan checkpoint for the chunk teacher; "" = the video teacher
    replay: bool = True                   # grad via one teacher-forcing replay forward instead of the rollout
    # RMD scores the first chunk with the *base* teacher and its own critic, combined as
    # (w·n₁·L_first + n_rest·L_rest)/(n_rest + w·n₁); None scores it like every other chunk
    first_chunk_weight: float | None = None
    # stage 2 (stage2.yaml) settings, applied from chunk_stage_iterations on; None keeps the optim section's
    video_lr_generator: float | None = None          # RMD stage 2: 2e-6
    video_lr_critic: float | None = None             # RMD stage 2: 4e-7
    video_critic_steps_per_generator: int | None = None   # RMD stage 2: 5


def stage(step: int, cfg: Config) -> str:
    """"chunk" for the first ``chunk_stage_iterations`` iterations, then "video"."""
    return "chunk" if step < cfg.chunk_stage_iterations else "video"


def stage_settings(step: int, cfg: Config, lr_generator: float, lr_critic: float, ratio: int
                   ) -> tuple[float, float, int]:
    """(generator lr, critic lr, critic steps per generator step) in force at ``step``."""
    if stage(step, cfg) == "chunk":
        return lr_generator, lr_critic, ratio

    def pick(v, d):
        return d if v is None else v

    return (pick(cfg.video_lr_generator, lr_generator), pick(cfg.video_lr_critic, lr_critic),
            pick(cfg.video_critic_steps_per_generator, ratio))


def split_chunks(x: Tensor, frames: int) -> Tensor:
    """(B, C, F, H, W) → (B·n, C, frames, H, W), sample-major (row b·n + k is chunk k of sample b)."""
    b, c, f, h, w = x.shape
    if f % frames:
        raise ValueError(f"{f} latent frames do not split into score chunks of {frames}; "
                         "set rmd.score_chunk_frames to a divisor of the frame count")
    return rearrange(x, "b c (n k) h w -> (b n) c k h w", k=frames)


def merge_chunks(x: Tensor, batch: int) -> Tensor:
    """Inverse of ``split_chunks``."""
    return rearrange(x, "(b n) c k h w -> b c (n k) h w", b=batch)


def combine_first_chunk(loss_first: Tensor, loss_rest: Tensor, n_first: int, n_rest: int,
                        first_weight: float) -> Tensor:
    """RMD ``combine_frame_losses``: (w·n₁·L_first + n_rest·L_rest) / (n_rest + w·n₁)."""
    return (first_weight * n_first * loss_first + n_rest * loss_rest) / (n_rest + first_weight * n_first)


def teacher_forcing_mask(num_frames: int, chunk_frames: int) -> Tensor:
    """(2F, 2F) bool mask over [clean | noisy] frames (Self-Forcing ``_prepare_teacher_forcing_mask``):
    clean frames are block-causal among themselves; a noisy frame of block b sees the clean frames of blocks
    < b and the noisy frames of its own block."""
    blocks = torch.zeros(num_frames, dtype=torch.long)
    for i, sl in enumerate(chunk_slices(num_frames, chunk_frames)):
        blocks[sl] = i
    clean = blocks[None, :] <= blocks[:, None]
    noisy_to_clean = blocks[None, :] < blocks[:, None]
    noisy_to_noisy = blocks[None, :] == blocks[:, None]
    top = torch.cat([clean, torch.zeros_like(clean)], dim=1)
    bottom = torch.cat([noisy_to_clean, noisy_to_noisy], dim=1)
    return torch.cat([top, bottom], dim=0)


def replay_forward(student: CausalWan, rollout: RolloutResult, text: Tensor) -> Tensor:
    """x̂0 of every chunk at its exit step, with grad, from one teacher-forcing forward (RMD replay).

    Equals the rollout's own exit-step outputs (clean context written at t = 0)."""
    clean = rollout.video.detach()
    noisy = torch.cat(rollout.replay_inputs, dim=2)
    b, _, f = clean.shape[:3]
    t_noisy = torch.cat([torch.full((sl.stop - sl.start,), t) for sl, t in
                         zip(chunk_slices(f, student.chunk_frames), rollout.replay_timesteps)])
    timesteps = torch.cat([torch.zeros(f), t_noisy]).to(clean.device).expand(b, -1)
    positions = torch.cat([torch.arange(f), torch.arange(f)])
    mask = teacher_forcing_mask(f, student.chunk_frames)
    v = student(torch.cat([clean, noisy], dim=2), timesteps, text, frame_positions=positions, frame_mask=mask)
    return x0_from_flow(noisy, v[:, :, f:], t_noisy.to(clean.device)[None].expand(b, -1) / 1000)
