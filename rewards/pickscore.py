"""PickScore (Kirstain et al. 2023), as scored in Flow-GRPO / DiffusionNFT ``pickscore_scorer.py``.

    s = exp(logit_scale) · cos(E_img(x), E_txt(prompt)) / 26

CLIPModel ``yuvalkirstain/PickScore_v1`` with the ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K`` processor (224,
CLIP mean/std, text ≤ 77 tokens); the /26 is the anchors' "normalise to ≈[0, 1]" (set ``divisor=1`` for raw).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rewards.base import RewardInput


@dataclass
class Config:
    model: str = "yuvalkirstain/PickScore_v1"                     # hub id or local dir
    processor: str = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"      # hub id or local dir
    divisor: float = 26.0        # Flow-GRPO / DiffusionNFT: scores / 26
    max_length: int = 77
    quantize_uint8: bool = True  # anchors score PIL images made from uint8


class PickScore:
    """exp(logit_scale)·cos(image, prompt)/divisor with the PickScore_v1 CLIP-H model."""

    Config = Config
    name = "pickscore"
    accepts = ("image",)

    def __init__(self, cfg: Config | None = None):
        self.cfg = cfg or Config()
        self.model = self.processor = None

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        from rewards.clip_hf import load_clip, processor_geometry

        self.model, self.processor = load_clip(self.cfg.model, self.cfg.processor, device, dtype)
        self.geometry = processor_geometry(self.processor)
        self.device, self.dtype = device, dtype

    def __call__(self, batch: RewardInput) -> Tensor:
        from rewards.clip_hf import image_embeds, pixel_values, text_embeds

        px = pixel_values(batch.pixels.to(self.device), self.geometry, self.cfg.quantize_uint8, self.dtype)
        img = image_embeds(self.model, px)
        txt = text_embeds(self.model, self.processor.tokenizer, batch.prompts, self.cfg.max_length, self.device)
        scale = self.model.logit_scale.exp().float()
        return (scale * (img * txt).sum(-1) / self.cfg.divisor).cpu()
