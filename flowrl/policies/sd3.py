"""Stable Diffusion 3 / 3.5 (Medium, Large) as a flowrl policy: MMDiT velocity with CFG, LoRA adapters.

Components (diffusers ``StableDiffusion3Pipeline``): SD3Transformer2DModel, CLIP-L and CLIP-G
(CLIPTextModelWithProjection), T5-XXL encoder, AutoencoderKL, FlowMatchEulerDiscreteScheduler (shift 3.0).
Prompt encoding is the pipeline's own ``encode_prompt``; the velocity is the pipeline's denoising step:

    t = 1000·σ,   v = v_u + w·(v_c − v_u)  with one forward on the batch [uncond; cond]   (w > 1)

Latents: (B, 16, H/8, W/8) scaled as the pipeline keeps them; ``decode`` undoes ``(z − shift)·scale``.
Defaults: CFG 4.5 and SDE noise level 0.7 (Flow-GRPO SD3.5-M, flow_grpo ``config/base.py``), LoRA r=32/α=64 on
the joint-attention projections (flow_grpo ``train_sd3.py`` L418–437), max_sequence_length 256 (pipeline default).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.policies import components as comp
from flowrl.policies.base import PolicyBase, cfg_combine, resolve_guidance, scheduler_sigmas, sigma_batch
from flowrl.policies.lora import SD3_TARGETS, LoraConfig
from flowrl.types import Cond

HUB_IDS = {"sd3.5-medium": "stabilityai/stable-diffusion-3.5-medium",
           "sd3.5-large": "stabilityai/stable-diffusion-3.5-large"}

SPEC: comp.Spec = {
    "transformer": ("diffusers", "SD3Transformer2DModel"),
    "vae": ("diffusers", "AutoencoderKL"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "CLIPTextModelWithProjection"),
    "text_encoder_2": ("transformers", "CLIPTextModelWithProjection"),
    "text_encoder_3": ("transformers", "T5EncoderModel"),
    "tokenizer": comp.TOKENIZER, "tokenizer_2": comp.TOKENIZER, "tokenizer_3": comp.TOKENIZER,
}


@dataclass
class Config:
    guidance: float = 4.5
    max_sequence_length: int = 256
    lora: LoraConfig | None = field(default_factory=lambda: LoraConfig(rank=32, alpha=64, target_modules=SD3_TARGETS))
    keep_base: bool = True               # full fine-tune only: keep a frozen base copy for adapter(None)
    gradient_checkpointing: bool = False


class SD3Policy(PolicyBase):
    """SD3 / SD3.5 policy. Build with ``from_pretrained`` (hub id or local dir) or ``tiny()``."""

    family = "sd3"
    pipeline_class = "StableDiffusion3Pipeline"
    spec = SPEC
    default_path = HUB_IDS["sd3.5-medium"]
    config_class = Config

    def __init__(self, components: dict, config: Config | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None):
        from diffusers import StableDiffusion3Pipeline

        self._setup(components, config or Config(), device, dtype)
        self.pipe = StableDiffusion3Pipeline(**components)

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def tiny(cls, seed: int = 0, config: Config | None = None, device: torch.device | str = "cpu") -> SD3Policy:
        """Tiny offline SD3 (diffusers test sizes, ``test_pipeline_stable_diffusion_3.py``), float32, random weights."""
        from flowrl.policies.tiny import sd3_components

        return cls(sd3_components(seed), config or Config(), device, torch.float32)

    # ---- the Policy contract ------------------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return self.pipe.vae_scale_factor

    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """(C, H/f, W/f) with f the VAE factor; H and W must be multiples of f·patch_size."""
        if num_frames not in (None, 1):
            raise ValueError(f"{type(self).__name__} makes images; got num_frames={num_frames}")
        mult = self.vae_scale_factor * self.transformer.config.patch_size
        if height % mult or width % mult:
            raise ValueError(f"height and width must be multiples of {mult} for this model, got {height}×{width}")
        return (self.transformer.config.in_channels, height // self.vae_scale_factor, width // self.vae_scale_factor)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None,
               cfg: bool = True, images: Sequence | None = None) -> Cond:
        """``prompt_embeds`` (B, 77+L, D) and ``pooled_prompt_embeds`` (B, P) from the pipeline's encode_prompt;
        uncond from ``negative_prompts`` (default "")."""
        self.check_images(images, len(prompts))  # raises: this family takes no reference images
        prompts = list(prompts)
        pe, npe, ppe, nppe = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, device=self.device, do_classifier_free_guidance=cfg,
            negative_prompt=None if negative_prompts is None else list(negative_prompts),
            max_sequence_length=self.config.max_sequence_length)
        embeds = {"prompt_embeds": pe, "pooled_prompt_embeds": ppe}
        uncond = {"prompt_embeds": npe, "pooled_prompt_embeds": nppe} if cfg else None
        return Cond(embeds, uncond, prompts)

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """The pipeline's grid: static shift (3.0 for SD3.5), or dynamic with μ from the token count if the
        scheduler config asks for it (pipeline ``__call__`` step 5)."""
        mu = None
        if self.scheduler_config.get("use_dynamic_shifting"):
            from samplers.schedule import calculate_shift

            p = self.transformer.config.patch_size
            c = self.scheduler_config
            mu = calculate_shift((latents.shape[-2] // p) * (latents.shape[-1] // p),
                                 c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                                 c.get("base_shift", 0.5), c.get("max_shift", 1.16))
        return scheduler_sigmas(self.scheduler_config, num_steps, mu=mu).to(latents.device)

    def velocity(self, x: Tensor, sigma: Tensor | float, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) float32; CFG ``v_u + w(v_c − v_u)`` with one forward on [uncond; cond] when w > 1."""
        w, use_cfg = resolve_guidance(guidance, self.default_guidance, cond)
        t = sigma_batch(sigma, x.shape[0], x.device) * 1000.0
        pe, ppe = cond.embeds["prompt_embeds"], cond.embeds["pooled_prompt_embeds"]
        if use_cfg:
            x, t = torch.cat([x, x]), torch.cat([t, t])
            pe = torch.cat([cond.uncond["prompt_embeds"], pe])
            ppe = torch.cat([cond.uncond["pooled_prompt_embeds"], ppe])
        out = self._transformer_module()(hidden_states=x.to(self.dtype), encoder_hidden_states=pe.to(self.dtype),
                                         pooled_projections=ppe.to(self.dtype), timestep=t, return_dict=False)[0]
        v = out.float()
        if use_cfg:
            v_u, v_c = v.chunk(2)
            v = cfg_combine(v_c, v_u, w)
        return v

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Images (B, 3, H, W) in [0, 1]: ``vae.decode(z/scale + shift)`` then (x + 1)/2 clamped (pipeline)."""
        cfg = self.vae.config
        z = latents.to(self.vae.device, self.vae.dtype) / cfg.scaling_factor + cfg.shift_factor
        image = self.vae.decode(z, return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

