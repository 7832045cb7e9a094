"""Wan2.1 text-to-video (1.3B, 14B) as a flowrl policy: 3-D DiT velocity with CFG on video latents.

Components (diffusers ``WanPipeline``): WanTransformer3DModel, UMT5 encoder, AutoencoderKLWan (time ×4,
space ×8, 16 channels). Latents (B, 16, (F−1)/4 + 1, H/8, W/8); F − 1 must be a multiple of 4 (``pipeline_wan.py``).
Velocity, as the pipeline's step (``pipeline_wan.py``), two forwards (cond, then uncond):

    t = 1000·σ,   v = v_u + w·(v_c − v_u)   (w > 1; default 5.0, the pipeline's)

σ grid: FlowMatchEulerDiscreteScheduler with the checkpoint's shift. The Wan2.1 diffusers repos ship a
``UniPCMultistepScheduler`` with ``flow_shift`` (3.0 for 480p); flowrl samples with Euler/SDE kernels, so it builds
the flow-match Euler grid with ``shift = flow_shift`` instead (deviation: the UniPC grid differs slightly).
Decode: ``z·std + mean`` per channel, VAE decode, (x + 1)/2 clamped → (B, F, 3, H, W).
Defaults: CFG 5.0, max_sequence_length 512 (pipeline ``__call__``), LoRA r=32/α=64 on attention + FFN
(diffusers' Wan module names), SDE noise level 0.7 [R: no anchor value for Wan in the Flow-GRPO SDE].
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.policies import components as comp
from flowrl.policies.base import PolicyBase, cfg_combine, resolve_guidance, scheduler_sigmas, sigma_batch
from flowrl.policies.lora import WAN_TARGETS, LoraConfig
from flowrl.types import Cond

HUB_IDS = {"wan2.1-t2v-1.3b": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
           "wan2.1-t2v-14b": "Wan-AI/Wan2.1-T2V-14B-Diffusers"}

SPEC: comp.Spec = {
    "transformer": ("diffusers", "WanTransformer3DModel"),
    "vae": ("diffusers", "AutoencoderKLWan"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "UMT5EncoderModel"),
    "tokenizer": comp.TOKENIZER,
}


@dataclass
class Config:
    guidance: float = 5.0
    max_sequence_length: int = 512
    lora: LoraConfig | None = field(default_factory=lambda: LoraConfig(rank=32, alpha=64, target_modules=WAN_TARGETS))
    keep_base: bool = True
    gradient_checkpointing: bool = False


def euler_scheduler_from_config(config: dict):
    """A FlowMatchEulerDiscreteScheduler for a Wan scheduler config (FlowMatch as is; UniPC: shift=flow_shift)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    if "flow_shift" not in config:                       # already a flow-match Euler config
        return FlowMatchEulerDiscreteScheduler.from_config(config)
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=config.get("num_train_timesteps", 1000),
                                           shift=config.get("flow_shift") or 1.0)


class WanPolicy(PolicyBase):
    """Wan2.1 T2V policy. Build with ``from_pretrained`` (hub id or local dir) or ``tiny()``."""

    family = "wan"
    pipeline_class = "WanPipeline"
    shard_blocks = ("blocks",)          # FSDP units: the transformer's blocks
    spec = SPEC
    config_class = Config

    def __init__(self, components: dict, config: Config | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None):
        from diffusers import WanPipeline

        self._setup(components, config or Config(), device, dtype)
        self.pipe = WanPipeline(**components)

    @classmethod
    def from_pretrained(cls, path: str = HUB_IDS["wan2.1-t2v-1.3b"], dtype: torch.dtype = torch.bfloat16,
                        device: torch.device | str = "cpu", config: Config | None = None) -> WanPolicy:
        """Load every component with its ``from_pretrained(path, subfolder=...)``; VAE kept float32; the
        scheduler config becomes a flow-match Euler scheduler (see module docstring)."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        config = config or cls._saved_config(path)
        parts = comp.load_components(path, SPEC, dtype, device, skip=("scheduler",))
        parts["scheduler"] = euler_scheduler_from_config(
            FlowMatchEulerDiscreteScheduler.load_config(path, subfolder="scheduler"))
        policy = cls(parts, config, device, dtype)
        policy._load_saved_adapters(path)
        return policy

    @classmethod
    def tiny(cls, seed: int = 0, config: Config | None = None, device: torch.device | str = "cpu") -> WanPolicy:
        """Tiny offline Wan (diffusers test sizes, UMT5 text encoder; ``test_wan.py``), float32."""
        from flowrl.policies.tiny import wan_components

        return cls(wan_components(seed), config or Config(), device, torch.float32)

    tiny_spatial_multiple = 16         # the tiny preset keeps Wan's VAE factor 8 and patch 2
    temporal_factor = 4                # num_frames − 1 must be a multiple of the VAE's temporal factor

    @classmethod
    def _spatial_multiple_from(cls, vae: dict, transformer: dict) -> int:
        """2^len(temperal_downsample) (Wan's spatial VAE factor) · the transformer's spatial patch."""
        return 2 ** len(vae.get("temperal_downsample", [False, True, True])) * int(transformer["patch_size"][1])

    @classmethod
    def check_frames(cls, num_frames: int | None) -> None:
        """Videos: a frame count F with F − 1 divisible by the temporal factor (e.g. 33, 81)."""
        if num_frames is None or num_frames < 1 or (num_frames - 1) % cls.temporal_factor:
            raise ValueError(f"num_frames: Wan makes videos of F frames with F − 1 divisible by "
                             f"{cls.temporal_factor} (e.g. 33 or 81), got {num_frames}")

    # ---- the Policy contract ------------------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """(z_dim, (F−1)/4 + 1, H/8, W/8) (z_dim 16; the VAE's channels and factors are read from it); F − 1 a
        multiple of the temporal factor, H, W multiples of the spatial factor · patch."""
        if num_frames is None:
            raise ValueError("WanPolicy makes videos: pass num_frames (e.g. 81 or 33; F − 1 divisible by 4)")
        ft, fs = self.pipe.vae_scale_factor_temporal, self.pipe.vae_scale_factor_spatial
        mult = fs * self.transformer.config.patch_size[1]
        if (num_frames - 1) % ft:
            raise ValueError(f"num_frames − 1 must be divisible by {ft}, got num_frames={num_frames}")
        if height % mult or width % mult:
            raise ValueError(f"height and width must be multiples of {mult} for Wan, got {height}×{width}")
        return (self.vae.config.z_dim, (num_frames - 1) // ft + 1, height // fs, width // fs)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None,
               cfg: bool = True, images: Sequence | None = None) -> Cond:
        """``prompt_embeds`` (B, L, 4096) from UMT5 (pipeline's encode_prompt: cleaned text, zeroed padding);
        uncond from ``negative_prompts`` (default "")."""
        self.check_images(images, len(prompts))  # raises: this family takes no reference images
        prompts = list(prompts)
        pe, npe = self.pipe.encode_prompt(
            prompt=prompts, negative_prompt=None if negative_prompts is None else list(negative_prompts),
            do_classifier_free_guidance=cfg, max_sequence_length=self.config.max_sequence_length,
            device=self.device)
        return Cond({"prompt_embeds": pe}, {"prompt_embeds": npe} if cfg else None, prompts)

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """The pipeline's grid: ``set_timesteps(num_steps)`` with a static shift (resolution-independent)."""
        return scheduler_sigmas(self.scheduler_config, num_steps).to(latents.device)

    def velocity(self, x: Tensor, sigma: Tensor | float, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) float32 (B, 16, F', H', W'); CFG with separate cond / uncond forwards when w > 1."""
        w, use_cfg = resolve_guidance(guidance, self.default_guidance, cond)
        t = sigma_batch(sigma, x.shape[0], x.device) * 1000.0
        x_in = x.to(self.dtype)
        v = self._forward(x_in, t, cond.embeds)
        if use_cfg:
            v = cfg_combine(v, self._forward(x_in, t, cond.uncond), w)
        return v

    def _forward(self, x: Tensor, t: Tensor, embeds: dict) -> Tensor:
        out = self._transformer_module()(hidden_states=x, timestep=t,
                                         encoder_hidden_states=embeds["prompt_embeds"].to(self.dtype),
                                         return_dict=False)[0]
        return out.float()

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Videos (B, F, 3, H, W) in [0, 1]: ``vae.decode(z·std + mean)``, (x + 1)/2 clamped (pipeline)."""
        cfg = self.vae.config
        shape = (1, cfg.z_dim, 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean).view(shape).to(self.vae.device, self.vae.dtype)
        std = torch.tensor(cfg.latents_std).view(shape).to(self.vae.device, self.vae.dtype)
        z = latents.to(self.vae.device, self.vae.dtype) / (1.0 / std) + mean
        video = self.vae.decode(z, return_dict=False)[0]          # (B, 3, F, H, W) in [-1, 1]
        return (video.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4).contiguous()
