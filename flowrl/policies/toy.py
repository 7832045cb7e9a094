"""The toy text-to-image policy of the shapes world: a small SD3 transformer in pixel space (CPU, minutes).

Same Policy contract as SD3/FLUX/Wan, so every sampler, objective and the trainer run on it unchanged:

    latents x = 2·pixels − 1 (3, 32, 32)   (identity "VAE"; decode = clamp((x + 1)/2, 0, 1)),
    v(x, σ) = SD3Transformer2DModel(x, t = 1000·σ, text) with CFG v_u + w·(v_c − v_u)   (SD3Policy.velocity),

text = a small CLIPTextModelWithProjection (last hidden states + projected pooled embedding) over a word-level
tokenizer of the shapes grammar. σ grid: diffusers' FlowMatchEulerDiscreteScheduler with ``shift`` (1.0: the
model was trained with logit-normal σ on 32×32 pixels, where SD3's resolution shift of 3 does not apply).
``ToyPolicy.from_pretrained()`` loads the checkpoint shipped in ``flowrl/assets/toy/`` (see docs/shapes.md).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.policies import toy_modules as tm
from flowrl.policies.base import scheduler_sigmas
from flowrl.policies.lora import SD3_TARGETS, LoraConfig
from flowrl.policies.sd3 import SD3Policy
from flowrl.policies.toy_base import ToyPolicyBase
from flowrl.types import Cond

IMAGE_SIZE = 32


@dataclass
class Config:
    guidance: float = 1.0      # one forward per step; CFG 1.5 measured +5 points strict at 2× cost (docs/shapes.md)
    shift: float = 1.0         # σ-grid shift of the FlowMatchEuler scheduler
    lora: LoraConfig | None = field(default_factory=lambda: LoraConfig(rank=32, alpha=64, target_modules=SD3_TARGETS))
    keep_base: bool = True     # full fine-tune only: keep a frozen base copy for adapter(None)
    gradient_checkpointing: bool = False


class ToyPolicy(ToyPolicyBase):
    """Toy shapes-world policy. Build with ``from_pretrained()`` (shipped checkpoint) or ``tiny()`` (random)."""

    family = "toy"
    config_class = Config
    modules = tm
    velocity = SD3Policy.velocity  # one velocity/CFG implementation for every SD3-architecture policy

    @classmethod
    def check_resolution(cls, height: int, width: int, num_frames: int | None = None, *, tiny: bool = False,
                         path=None) -> None:
        """The shapes world is 32×32 images only (the checkpoint is not read)."""
        for key, value in (("height", height), ("width", width)):
            if value != IMAGE_SIZE:
                raise ValueError(f"{key} must be {IMAGE_SIZE} for the toy shapes world (32×32 images), got {value}")
        cls.check_frames(num_frames)

    # ---- the Policy contract ------------------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """(3, 32, 32): pixel space; the shapes world is 32×32 only."""
        if num_frames not in (None, 1):
            raise ValueError(f"ToyPolicy makes images; got num_frames={num_frames}")
        if (height, width) != (IMAGE_SIZE, IMAGE_SIZE):
            raise ValueError(f"ToyPolicy generates {IMAGE_SIZE}×{IMAGE_SIZE} images (the shapes world), "
                             f"got {height}×{width}; set height=width={IMAGE_SIZE}")
        return (self.transformer.config.in_channels, height, width)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None,
               cfg: bool = True, images: Sequence | None = None) -> Cond:
        """``prompt_embeds`` (B, 16, D) and ``pooled_prompt_embeds`` (B, P); uncond from ``negative_prompts``
        (default "", the prompt-dropout token sequence of pretraining)."""
        self.check_images(images, len(prompts))  # raises: this family takes no reference images
        prompts = list(prompts)
        embeds = self._embed(prompts)
        uncond = None
        if cfg:
            neg = [""] * len(prompts) if negative_prompts is None else list(negative_prompts)
            if len(neg) != len(prompts):
                raise ValueError(f"{len(neg)} negative prompts for {len(prompts)} prompts; pass one per prompt")
            uncond = self._embed(neg)
        return Cond(embeds, uncond, prompts)

    def _embed(self, prompts: list[str]) -> dict[str, Tensor]:
        ids = tm.tokenize(self.tokenizer, prompts).to(self.device)
        pe, pooled = tm.encode_text(self.text_encoder, ids)
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """diffusers FlowMatchEulerDiscreteScheduler(shift).set_timesteps(num_steps) grid, ending with 0."""
        return scheduler_sigmas(self.scheduler_config, num_steps)

    def decode(self, latents: Tensor) -> Tensor:
        """Pixels (B, 3, 32, 32) = clamp((x + 1)/2, 0, 1) in float32 (identity VAE; differentiable)."""
        return ((latents.float() + 1) / 2).clamp(0, 1)

    def encode_pixels(self, pixels: Tensor) -> Tensor:
        """Latents 2·pixels − 1 (inverse of ``decode`` on [0, 1])."""
        return pixels.float() * 2 - 1
