"""Source fidelity of an edit: how close the result stays to the prompt's source image (``RewardInput.images``).

    r = −scale · mean_{c,h,w} |x − resize(src)|       (src resized, bilinear antialiased, to the result's H × W)

the pixel L1 distance image-editing benchmarks report for preservation (MagicBrush, arXiv 2306.10012, §4 "L1");
NaN ("does not apply") for a sample whose prompt has no source image. Videos: the mean over frames.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rewards.base import RewardInput


@dataclass
class Config:
    scale: float = 1.0


class SourceFidelity:
    """r = −scale·L1(result, source): higher for edits that change less of the source image."""

    Config = Config
    name = "source_fidelity"
    accepts = ("image", "video")

    def __init__(self, cfg: Config | None = None):
        self.cfg = cfg or Config()

    def __call__(self, batch: RewardInput) -> Tensor:
        out = torch.full((len(batch),), float("nan"))
        if batch.images is None:
            return out
        h, w = batch.pixels.shape[-2:]
        for i, srcs in enumerate(batch.images):
            if not srcs:
                continue
            src = torch.nn.functional.interpolate(srcs[0][None].float(), size=(h, w), mode="bilinear",
                                                  antialias=True, align_corners=False)[0].clamp(0, 1)
            px = batch.pixels[i].float().cpu()
            out[i] = -self.cfg.scale * (px - src).abs().mean()
        return out
