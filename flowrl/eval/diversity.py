"""Seed diversity: how different a prompt's samples are across evaluation seeds (mode collapse shows as a drop).

For prompt p with samples x_1..x_S (S ≥ 2 seeds), each reduced to a small image x̃ by area averaging so that its
longer side is at most ``size`` (64 px by default; smaller images are used as they are):

    D_p = mean_{i<j} RMS(x̃_i − x̃_j),   RMS(d) = sqrt(mean over channels, pixels (and frames) of d²)
    seed_diversity = mean over prompts with S ≥ 2 of D_p

RMS is in pixel units ([0, 1]): two constant images of colours a and b are sqrt(mean_c (a_c − b_c)²) apart.
Why the downsampling: it compares composition and colour layout, which is what collapses, rather than
per-pixel noise, which a hacked policy can add independently per seed and which would *raise* a full-resolution
figure; it also makes the figure cheap and comparable across resolutions. The shapes world (32×32) is compared at
full resolution. Diversity-aware RL methods (DiverseGRPO; D²-Align, arXiv 2512.24146) report semantic diversity
in feature spaces; this is the pixel-space figure every evaluation can afford.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["DIVERSITY_SIZE", "downsample", "pairwise_rms", "prompt_diversity", "seed_diversity"]

DIVERSITY_SIZE = 64


def downsample(images: Tensor, size: int | None = DIVERSITY_SIZE) -> Tensor:
    """Area-average (N, [F,] C, H, W) so the longer side is ≤ size (None: unchanged); float32."""
    if images.dim() not in (4, 5):
        raise ValueError(f"images must be (N, C, H, W) or (N, F, C, H, W), got {tuple(images.shape)}")
    if size is not None and size < 1:
        raise ValueError(f"downsample: size must be >= 1 or None, got {size}")
    x = images.float()
    h, w = x.shape[-2:]
    if size is None or max(h, w) <= size:
        return x
    scale = size / max(h, w)
    out_hw = (max(1, round(h * scale)), max(1, round(w * scale)))
    flat = x.reshape(-1, *x.shape[-3:])
    return F.adaptive_avg_pool2d(flat, out_hw).reshape(*x.shape[:-2], *out_hw)


def pairwise_rms(x: Tensor) -> Tensor:
    """(S, S) matrix of RMS(x_i − x_j) over all remaining dimensions of x (S, ...)."""
    flat = x.reshape(x.shape[0], -1).double()
    rows = [(flat - flat[i]).square().mean(1).sqrt() for i in range(flat.shape[0])]  # exact 0 for equal images
    return torch.stack(rows).float()


def prompt_diversity(images: Tensor, prompt_ids, *, size: int | None = DIVERSITY_SIZE) -> dict[int, float]:
    """{prompt id: D_p} for every prompt with at least two samples (see the module docstring).

    images: (N, [F,] 3, H, W) in [0, 1]; prompt_ids: N ids (tensor or sequence), one per image."""
    ids = torch.as_tensor(prompt_ids).flatten()
    if ids.numel() != images.shape[0]:
        raise ValueError(f"prompt_ids has {ids.numel()} entries for {images.shape[0]} images")
    small = downsample(images, size)
    out = {}
    for pid in torch.unique(ids).tolist():
        group = small[ids == pid]
        s = group.shape[0]
        if s < 2:
            continue
        upper = torch.triu_indices(s, s, offset=1)
        out[int(pid)] = pairwise_rms(group)[upper[0], upper[1]].mean().item()
    return out


def seed_diversity(images: Tensor, prompt_ids, *, size: int | None = DIVERSITY_SIZE) -> float:
    """Mean over prompts of D_p (NaN when no prompt has two samples)."""
    per_prompt = prompt_diversity(images, prompt_ids, size=size)
    return sum(per_prompt.values()) / len(per_prompt) if per_prompt else math.nan
