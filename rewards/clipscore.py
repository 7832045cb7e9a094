"""CLIP score: image–prompt cosine of an open_clip CLIP (DiffusionNFT ``clip_scorer.py``: ViT-L/14 OpenAI
weights, ``logits_per_image.diag()/100`` = cos).

    s = scale · cos(f_img(x), f_txt(prompt))          (default scale 1, no clamp: DiffusionNFT)
    Hessel et al. 2021 CLIPScore: scale = 2.5, clamp_negative = True (with ViT-B-32)
    Flow-GRPO ``clipscore``: logits/30, i.e. scale = 100/30
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rewards.base import RewardInput
from rewards.clip_openclip import OpenClipReward
from rewards.preprocess import quantize_uint8


@dataclass
class Config:
    model_name: str = "ViT-L-14"
    pretrained: str | None = "openai"     # open_clip tag, local file, or None with `checkpoint`
    checkpoint: str | None = None
    checkpoint_key: str | None = None
    model_config: str | None = None
    scale: float = 1.0
    clamp_negative: bool = False
    quantize_uint8: bool = True


class CLIPScore(OpenClipReward):
    """scale · cos(image, prompt) with an open_clip model."""

    Config = Config
    name = "clipscore"

    def __call__(self, batch: RewardInput) -> Tensor:
        from rewards.clip_openclip import clip_pixels, encode_images, encode_texts

        x = batch.pixels.to(self.device)
        x = quantize_uint8(x) if self.cfg.quantize_uint8 else x
        img = encode_images(self.model, clip_pixels(self.model, x, self.dtype))
        cos = (img * encode_texts(self.model, self.tokenizer, batch.prompts, self.device)).sum(-1)
        cos = cos.clamp(min=0) if self.cfg.clamp_negative else cos
        return (self.cfg.scale * cos).cpu()
