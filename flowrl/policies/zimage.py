"""Z-Image (6B S3-DiT; -Turbo distilled) as a flowrl policy: single-stream transformer on per-sample lists,
inverted time, negated output, CFG with optional norm clipping and truncation.

Components (diffusers ``ZImagePipeline``): ZImageTransformer2DModel, AutoencoderKL (16 channels), Qwen3 text
encoder + tokenizer, FlowMatchEulerDiscreteScheduler. Text: the chat template with ``enable_thinking=True``, padded
to ``max_sequence_length``, the second-to-last hidden state, padding dropped (the pipeline's ``encode_prompt``); the
variable-length rows are kept here zero-padded to ``max_sequence_length`` with a boolean ``prompt_mask`` so
``Cond`` stays batch-first and chunks concatenate. Velocity, as the pipeline's step (``pipeline_z_image.py``):

    out = F([x_b as (C, 1, h, w)], (1000 − 1000σ)/1000, [c_b])          (the model's time runs 0 = noise → 1 = clean)
    pred = pos + s·(pos − neg)       (s = w − 1 for guidance w > 1; CFG off where 1 − σ > cfg_truncation)
    pred ← pred · min(1, cfg_normalization·‖pos‖/‖pred‖)   (per sample, when cfg_normalization > 0)
    v = −pred                                                  (the pipeline negates before scheduler.step)

``guidance`` is the standard CFG weight w of every flowrl family (v_u + w(v_c − v_u), CFG when w > 1); the
pipeline's ``guidance_scale`` is s = w − 1 (its default 5.0 is w = 6). The CFG batch is one forward on
[pos rows; neg rows] like the pipeline's.
σ grid: ``linspace(1, 1/N, N)`` with μ = calculate_shift((h/2)(w/2), 256, 4096, 0.5, 1.15) handed to the scheduler
(used when its config enables dynamic shifting, else its static shift). Latents (B, 16, H/8, W/8);
decode ``vae.decode(z/scale + shift)``. Defaults: guidance w = 5.0 (Flow-Factory ``grpo/full/z_image/default.yaml``
"CFG 4.0", read as the pipeline's guidance_scale s), full fine-tune (same anchor); cfg_normalization off and
cfg_truncation 1.0 (the pipeline's defaults).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.policies import components as comp
from flowrl.policies.base import PolicyBase, resolve_guidance, sigma_batch
from flowrl.policies.lora import LoraConfig
from flowrl.types import Cond

HUB_IDS = {"z-image": "Tongyi-MAI/Z-Image", "z-image-turbo": "Tongyi-MAI/Z-Image-Turbo"}

SPEC: comp.Spec = {
    "transformer": ("diffusers", "ZImageTransformer2DModel"),
    "vae": ("diffusers", "AutoencoderKL"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Qwen3Model"),
    "tokenizer": comp.TOKENIZER,
}


@dataclass
class Config:
    guidance: float = 5.0                # CFG weight w; the pipeline's guidance_scale s = w − 1 (anchor s = 4.0)
    cfg_normalization: float = 0.0       # > 0: clip ‖pred‖ to this × ‖pos‖ per sample (pipeline: off)
    cfg_truncation: float = 1.0          # CFG off where 1 − σ exceeds this (pipeline default 1.0: never)
    max_sequence_length: int = 512
    lora: LoraConfig | None = None       # the anchor trains the full transformer (in fp32)
    keep_base: bool = True
    gradient_checkpointing: bool = False


class ZImagePolicy(PolicyBase):
    """Z-Image policy. Build with ``from_pretrained`` (hub id or local dir) or ``tiny()``."""

    family = "zimage"
    pipeline_class = "ZImagePipeline"
    shard_blocks = ("noise_refiner", "context_refiner", "layers")      # every ZImageTransformerBlock
    spec = SPEC
    default_path = HUB_IDS["z-image"]
    config_class = Config
    tiny_spatial_multiple = 2          # tiny VAE factor 1 × patch 2

    def __init__(self, components: dict, config: Config | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None):
        from diffusers import ZImagePipeline

        self._setup(components, config or Config(), device, dtype)
        self.pipe = ZImagePipeline(**components)

    @classmethod
    def tiny(cls, seed: int = 0, config: Config | None = None, device: torch.device | str = "cpu") -> ZImagePolicy:
        """Tiny offline Z-Image (``tiny_chat.zimage_components``), float32, random weights."""
        from flowrl.policies.tiny_chat import zimage_components

        return cls(zimage_components(seed), config or Config(), device, torch.float32)

    @classmethod
    def _spatial_multiple_from(cls, vae: dict, transformer: dict) -> int:
        return 2 ** (len(vae["block_out_channels"]) - 1) * int(transformer["all_patch_size"][0])

    # ---- the Policy contract ------------------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """(C, H/f, W/f); H and W must be multiples of 2f (the transformer's 2×2 patches)."""
        self.check_frames(num_frames)
        f = self.pipe.vae_scale_factor
        if height % (2 * f) or width % (2 * f):
            raise ValueError(f"height and width must be multiples of {2 * f} for zimage, got {height}×{width}")
        return (self.transformer.config.in_channels, height // f, width // f)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None,
               cfg: bool = True, images: Sequence | None = None) -> Cond:
        """``prompt_embeds`` (B, max_sequence_length, D) zero-padded + ``prompt_mask`` (B, L) from the pipeline's
        ``encode_prompt``; uncond from ``negative_prompts`` (default "") when ``cfg``."""
        self.check_images(images, len(prompts))  # raises: this family takes no reference images
        prompts = list(prompts)
        embeds = self._encode(prompts)
        uncond = None
        if cfg:
            neg = list(negative_prompts) if negative_prompts is not None else [""] * len(prompts)
            if len(neg) != len(prompts):
                raise ValueError(f"got {len(neg)} negative prompts for {len(prompts)} prompts")
            uncond = self._encode(neg)
        return Cond(embeds, uncond, prompts)

    def _encode(self, prompts: list[str]) -> dict[str, Tensor]:
        rows, _ = self.pipe.encode_prompt(prompt=list(prompts), device=self.device, do_classifier_free_guidance=False,
                                          max_sequence_length=self.config.max_sequence_length)
        n = self.config.max_sequence_length
        pe = torch.zeros(len(rows), n, rows[0].shape[-1], device=self.device, dtype=rows[0].dtype)
        mask = torch.zeros(len(rows), n, dtype=torch.bool, device=self.device)
        for b, r in enumerate(rows):
            pe[b, :r.shape[0]], mask[b, :r.shape[0]] = r, True
        return {"prompt_embeds": pe, "prompt_mask": mask}

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """The pipeline's grid: linspace(1, 1/N, N) and μ from the (h/2)(w/2) token count."""
        import numpy as np

        from flowrl.policies.base import scheduler_sigmas
        from samplers.schedule import calculate_shift

        c = self.scheduler_config
        mu = calculate_shift((latents.shape[-2] // 2) * (latents.shape[-1] // 2), c.get("base_image_seq_len", 256),
                             c.get("max_image_seq_len", 4096), c.get("base_shift", 0.5), c.get("max_shift", 1.15))
        return scheduler_sigmas(c, num_steps, mu=mu,
                                sigmas=np.linspace(1.0, 1 / num_steps, num_steps)).to(latents.device)

    def velocity(self, x: Tensor, sigma: Tensor | float, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) float32 (B, C, h, w) under the pipeline's CFG form (module doc); σ must be one value per call
        when CFG truncation is on (the pipeline applies it per step)."""
        b = x.shape[0]
        w, use_cfg = resolve_guidance(guidance, self.default_guidance, cond)
        s = w - 1.0 if use_cfg else 0.0              # the pipeline's guidance_scale
        sig = sigma_batch(sigma, b, x.device)
        t = (1000 - sig * 1000.0) / 1000            # the pipeline: (1000 − t)/1000 with t = 1000σ
        if s > 0 and self.config.cfg_truncation <= 1:
            keep = t <= self.config.cfg_truncation
            if not keep.all():
                if keep.any():
                    raise ValueError("CFG truncation with a σ batch that straddles cfg_truncation: call velocity "
                                     "with one σ per call")
                s = 0.0
        rows = list(x.to(self.dtype).unsqueeze(2).unbind(0))
        caps = self._rows(cond.embeds)
        if s > 0:
            rows, caps, t = rows + rows, caps + self._rows(cond.uncond), torch.cat([t, t])
        out = self._transformer_module()(rows, t, caps, return_dict=False)[0]
        out = [o.float() for o in out]
        if s > 0:
            pred = []
            for pos, neg in zip(out[:b], out[b:], strict=True):
                p = pos + s * (pos - neg)
                if self.config.cfg_normalization > 0:
                    cap = torch.linalg.vector_norm(pos) * self.config.cfg_normalization
                    norm = torch.linalg.vector_norm(p)
                    p = torch.where(norm > cap, p * (cap / norm), p)
                pred.append(p)
            out = pred
        return -torch.stack(out).squeeze(2)

    def _rows(self, embeds: dict[str, Tensor]) -> list[Tensor]:
        """The pipeline's list of variable-length caption features, back from the padded tensor and mask."""
        return [pe[m].to(self.dtype) for pe, m in zip(embeds["prompt_embeds"], embeds["prompt_mask"], strict=True)]

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Images (B, 3, H, W) in [0, 1]: ``vae.decode(z/scale + shift)`` then (x + 1)/2 clamped (pipeline)."""
        cfg = self.vae.config
        z = latents.to(self.vae.device, self.vae.dtype) / cfg.scaling_factor + cfg.shift_factor
        return (self.vae.decode(z, return_dict=False)[0].float() / 2 + 0.5).clamp(0, 1)

