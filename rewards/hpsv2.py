"""HPSv2.1 human preference score (Wu et al. 2023; tgxs002/HPSv2 ``img_score.py``, DiffusionNFT
``hpsv2_scorer.py``):

    s = ⟨f_img(x), f_txt(prompt)⟩  (both L2-normalised, no logit scale; ≈ 0.2–0.35)

open_clip ``ViT-H-14`` with the ``HPS_v2.1_compressed.pt`` weights (``checkpoint["state_dict"]``, HF repo
``xswu/HPSv2``); eval transform ResizeMaxSize(224) with zero padding, then OpenAI CLIP normalisation (no crop).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rewards.base import RewardInput
from rewards.clip_openclip import OpenClipReward
from rewards.preprocess import hps_preprocess, quantize_uint8


@dataclass
class Config:
    model_name: str = "ViT-H-14"
    checkpoint: str = "hf-hub:xswu/HPSv2/HPS_v2.1_compressed.pt"  # or a local file
    checkpoint_key: str = "state_dict"
    pretrained: str | None = None      # the HPS checkpoint holds every weight; base CLIP not needed
    model_config: str | None = None    # JSON open_clip config for a custom architecture
    image_size: int = 224
    quantize_uint8: bool = True


class HPSv2(OpenClipReward):
    """HPSv2.1: cosine of the HPS-tuned open_clip ViT-H-14 image and prompt embeddings."""

    Config = Config
    name = "hpsv2"

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        from rewards.clip_openclip import preprocess_cfg

        super().setup(device, dtype)
        self.norm = preprocess_cfg(self.model)

    def __call__(self, batch: RewardInput) -> Tensor:
        from rewards.clip_openclip import encode_images, encode_texts

        x = batch.pixels.to(self.device)
        x = quantize_uint8(x) if self.cfg.quantize_uint8 else x
        px = hps_preprocess(x, self.cfg.image_size, self.norm["mean"], self.norm["std"]).to(self.dtype)
        img = encode_images(self.model, px)
        txt = encode_texts(self.model, self.tokenizer, batch.prompts, self.device)
        return (img * txt).sum(-1).cpu()
