"""JPEG (in)compressibility rewards of DDPO (Black et al. 2023, ddpo-pytorch ``rewards.py``).

    size_kB(x) = len(JPEG_q95(round(255·x))) / 1000
    compressibility   r = −scale · size_kB        incompressibility   r = +scale · size_kB

DDPO uses scale 1 (kB); Flow-GRPO's ``jpeg_compressibility`` uses −size_kB/500, i.e. scale = 1/500.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import torch
from torch import Tensor

from rewards.base import RewardInput


def jpeg_sizes_kb(pixels: Tensor, quality: int = 95) -> Tensor:
    """(B,) size in kB (1000 bytes) of each (3, H, W) image in [0, 1] saved as JPEG at ``quality`` by PIL."""
    from PIL import Image

    arr = (pixels.detach().float().cpu() * 255).round().clamp(0, 255).to(torch.uint8)
    arr = arr.permute(0, 2, 3, 1).numpy()
    sizes = []
    for img in arr:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality)
        sizes.append(buf.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float32)


@dataclass
class Config:
    quality: int = 95    # DDPO: JPEG quality 95
    scale: float = 1.0   # DDPO: kB; Flow-GRPO: 1/500


class JpegCompressibility:
    """r = −scale·size_kB of the q95 JPEG: higher for images that compress well (DDPO)."""

    Config = Config
    name = "jpeg_compressibility"
    accepts = ("image",)
    sign = -1.0

    def __init__(self, cfg: Config | None = None):
        self.cfg = cfg or Config()

    def __call__(self, batch: RewardInput) -> Tensor:
        return self.sign * self.cfg.scale * jpeg_sizes_kb(batch.pixels, self.cfg.quality)


class JpegIncompressibility(JpegCompressibility):
    """r = +scale·size_kB of the q95 JPEG: higher for detailed, hard-to-compress images (DDPO)."""

    name = "jpeg_incompressibility"
    sign = 1.0
