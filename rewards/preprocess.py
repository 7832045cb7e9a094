"""Batched image preprocessing for reward models, as torch ops on the reward's device (no PIL round trip).

Each function takes float pixels (B, 3, H, W) in [0, 1] and reproduces one published pipeline:
  * CLIP (transformers CLIPImageProcessor, open_clip "shortest"): resize the shortest side to ``size``
    (bicubic), center-crop ``crop``, normalise with the model's mean/std;
  * HPSv2 (open_clip ``ResizeMaxSize`` of tgxs002/HPSv2): resize the longest side to ``size``, pad to a
    square with ``fill`` (centred), normalise; no crop.
The anchors feed rewards PIL images made from uint8, so ``quantize_uint8`` rounds to the 256 levels first.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def quantize_uint8(x: Tensor) -> Tensor:
    """round(255·x)/255: the values a PIL image made from these pixels holds.

    Straight-through: the forward value is quantised, the gradient passes as identity, so differentiable
    rewards (reward-gradient distillation) keep a gradient w.r.t. the pixels."""
    q = (x * 255).round().clamp(0, 255) / 255
    return x + (q - x).detach() if x.requires_grad else q


def _resize(x: Tensor, hw: tuple[int, int], mode: str) -> Tensor:
    if tuple(x.shape[-2:]) == tuple(hw):
        return x
    antialias = mode in ("bilinear", "bicubic")
    return F.interpolate(x, size=hw, mode=mode, align_corners=False if antialias else None,
                         antialias=antialias)


def shortest_side_size(h: int, w: int, size: int) -> tuple[int, int]:
    """(h', w') with min(h', w') = size and the aspect ratio kept (long side truncated, as transformers)."""
    if h <= w:
        return size, max(int(size * w / h), size)
    return max(int(size * h / w), size), size


def center_crop(x: Tensor, crop: tuple[int, int]) -> Tensor:
    """Central (ch, cw) window; top/left offsets (H − ch) // 2, (W − cw) // 2."""
    h, w = x.shape[-2:]
    ch, cw = crop
    if ch > h or cw > w:
        x = F.pad(x, ((cw - w + 1) // 2 if cw > w else 0, (cw - w) // 2 if cw > w else 0,
                      (ch - h + 1) // 2 if ch > h else 0, (ch - h) // 2 if ch > h else 0))
        h, w = x.shape[-2:]
    top, left = (h - ch) // 2, (w - cw) // 2
    return x[..., top:top + ch, left:left + cw]


def normalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """(x − mean) / std per channel."""
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s


def clip_preprocess(x: Tensor, size: int, crop: tuple[int, int], mean: Sequence[float] = OPENAI_CLIP_MEAN,
                    std: Sequence[float] = OPENAI_CLIP_STD, mode: str = "bicubic") -> Tensor:
    """CLIP eval transform: shortest side → size, center crop, normalise.  (B,3,H,W) → (B,3,crop)."""
    x = _resize(x.float(), shortest_side_size(*x.shape[-2:], size), mode)
    return normalize(center_crop(x, crop).clamp(0, 1), mean, std)


def resize_max_size_pad(x: Tensor, size: int, fill: float = 0.0, mode: str = "bicubic") -> Tensor:
    """HPSv2 ResizeMaxSize: longest side → size (other side round(dim·scale)), centred pad to size×size."""
    h, w = x.shape[-2:]
    scale = size / max(h, w)
    nh, nw = round(h * scale), round(w * scale)
    x = _resize(x.float(), (nh, nw), mode).clamp(0, 1)
    ph, pw = size - nh, size - nw
    return F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), value=fill)


def hps_preprocess(x: Tensor, size: int = 224, mean: Sequence[float] = OPENAI_CLIP_MEAN,
                   std: Sequence[float] = OPENAI_CLIP_STD) -> Tensor:
    """HPSv2 eval transform: ResizeMaxSize(size, fill=0) then Normalize(mean, std)."""
    return normalize(resize_max_size_pad(x, size), mean, std)
