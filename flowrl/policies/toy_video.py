"""The tiny video teacher of the moving-shapes world: a small bidirectional Wan2.1 transformer in pixel space.

Same Policy contract as Wan (so every sampler, objective and the trainer run on it unchanged), with the image
toy's choice of no VAE:

    latents x = 2·pixels − 1 laid out (3, F, H, W)   (identity "VAE"; decode = clamp((x + 1)/2, 0, 1), (B, F, 3, H, W)),
    v(x, σ) = WanTransformer3DModel(x, t = 1000·σ, text) with CFG v_u + w·(v_c − v_u)   (WanPolicy.velocity),

text = a small UMT5EncoderModel (Wan2.1's encoder class) over a word-level tokenizer of the moving-shapes
grammar. σ grid: diffusers' FlowMatchEulerDiscreteScheduler with ``shift`` (1.0: trained with logit-normal σ on
tiny pixel videos). Pretrain with ``scripts/pretrain_video_toy.py`` and load ``<out>/checkpoint`` (docs/video.md);
no checkpoint is shipped yet.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from flowrl.policies import toy_video_modules as tvm
from flowrl.policies.base import scheduler_sigmas
from flowrl.policies.lora import WAN_TARGETS, LoraConfig
from flowrl.policies.toy_base import ToyPolicyBase
from flowrl.policies.wan import WanPolicy
from flowrl.types import Cond


@dataclass
class Config:
    guidance: float = 1.0      # one forward per step (the image toy's default)
    shift: float = 1.0         # σ-grid shift of the FlowMatchEuler scheduler
    lora: LoraConfig | None = field(default_factory=lambda: LoraConfig(rank=32, alpha=64, target_modules=WAN_TARGETS))
    keep_base: bool = True     # full fine-tune only: keep a frozen base copy for adapter(None)
    gradient_checkpointing: bool = False


class VideoToyPolicy(ToyPolicyBase):
    """Tiny moving-shapes video policy. Build with ``from_pretrained(<pretrain out>/checkpoint)`` or ``tiny()``."""

    family = "toy_video"
    config_class = Config
    modules = tvm
    shard_blocks = ("blocks",)
    velocity = WanPolicy.velocity      # one velocity/CFG implementation for every Wan-architecture policy
    _forward = WanPolicy._forward

    @classmethod
    def check_resolution(cls, height: int, width: int, num_frames: int | None = None, *, tiny: bool = False,
                         path=None) -> None:
        """H and W multiples of the spatial patch (the tiny preset's, a local checkpoint's, else 8); F ≥ 1."""
        patch = tvm.PRESETS["tiny"]["transformer"]["patch_size"] if tiny else cls._patch_of(path)
        for key, value in (("height", height), ("width", width)):
            if value < 1 or value % patch[1]:
                raise ValueError(f"{key} must be a positive multiple of {patch[1]} for toy_video (its patch), "
                                 f"got {value}")
        cls.check_frames(num_frames)

    @staticmethod
    def _patch_of(path) -> tuple[int, int, int]:
        file = Path(path).expanduser() / "transformer" / "config.json" if path is not None else None
        if file is not None and file.is_file():
            return tuple(json.loads(file.read_text())["patch_size"])
        return tvm.PRESETS["small"]["transformer"]["patch_size"]

    @classmethod
    def check_frames(cls, num_frames: int | None) -> None:
        """Videos: any frame count F ≥ 1 (temporal patch 1; the moving-shapes world uses 8)."""
        if num_frames is None or num_frames < 1:
            raise ValueError(f"num_frames: toy_video makes videos, pass num_frames ≥ 1 (e.g. 8), got {num_frames}")

    # ---- the Policy contract ------------------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """(3, F, H, W): pixel space; H, W multiples of the transformer's spatial patch."""
        if num_frames is None or num_frames < 1:
            raise ValueError(f"VideoToyPolicy makes videos: pass num_frames ≥ 1 (e.g. 8), got {num_frames}")
        pt, ph, pw = self.transformer.config.patch_size
        if height % ph or width % pw or num_frames % pt:
            raise ValueError(f"height, width must be multiples of {ph} (the patch) for toy_video, got {height}×{width}")
        return (self.transformer.config.in_channels, num_frames, height, width)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None,
               cfg: bool = True, images: Sequence | None = None) -> Cond:
        """``prompt_embeds`` (B, 24, D), padding zeroed; uncond from ``negative_prompts`` (default "", the
        prompt-dropout token sequence of pretraining)."""
        self.check_images(images, len(prompts))  # raises: text-to-video only
        prompts = list(prompts)
        embeds = {"prompt_embeds": self._embed(prompts)}
        uncond = None
        if cfg:
            neg = [""] * len(prompts) if negative_prompts is None else list(negative_prompts)
            if len(neg) != len(prompts):
                raise ValueError(f"{len(neg)} negative prompts for {len(prompts)} prompts; pass one per prompt")
            uncond = {"prompt_embeds": self._embed(neg)}
        return Cond(embeds, uncond, prompts)

    def _embed(self, prompts: list[str]) -> Tensor:
        return tvm.encode_text(self.text_encoder, tvm.tokenize(self.tokenizer, prompts).to(self.device))

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """diffusers FlowMatchEulerDiscreteScheduler(shift).set_timesteps(num_steps) grid, ending with 0."""
        return scheduler_sigmas(self.scheduler_config, num_steps).to(latents.device)

    def decode(self, latents: Tensor) -> Tensor:
        """Videos (B, F, 3, H, W) = clamp((x + 1)/2, 0, 1) in float32 (identity VAE; differentiable)."""
        return ((latents.float() + 1) / 2).clamp(0, 1).permute(0, 2, 1, 3, 4)

    def encode_pixels(self, pixels: Tensor) -> Tensor:
        """Latents (B, 3, F, H, W) = 2·pixels − 1 of videos (B, F, 3, H, W) (inverse of ``decode`` on [0, 1])."""
        return pixels.float().permute(0, 2, 1, 3, 4) * 2 - 1
