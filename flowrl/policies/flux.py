"""FLUX.1-dev as a flowrl policy: guidance-distilled MMDiT, packed 2×2 latents, resolution-dependent shift.

Components (diffusers ``FluxPipeline``): FluxTransformer2DModel, CLIP-L (CLIPTextModel, pooled), T5-XXL,
AutoencoderKL (16 channels), FlowMatchEulerDiscreteScheduler with dynamic shifting.

Latents are exposed *unpacked*, (B, C, H/8, W/8), like every image policy; ``velocity`` packs them into the
(B, HW/4, 4C) token sequence the transformer reads and unpacks its output (a permutation, so elementwise sampler
math is unaffected). Velocity, as the pipeline's step (``pipeline_flux.py``):

    v = F(pack(x), timestep = (1000σ)/1000, guidance = g, txt_ids = 0, img_ids = (0, row, col))

with the *distilled* guidance g (default 3.5) fed to the guidance embedding, no doubled CFG batch. Optional
true CFG (``Config.true_cfg > 1`` and a Cond encoded with cfg=True; pipeline ``true_cfg_scale``):
v = v_neg + s·(v − v_neg), two forwards.
σ grid: ``linspace(1, 1/N, N)`` shifted by e^μ/(e^μ + 1/σ − 1), μ linear in the token count HW/4 (the pipeline's
``calculate_shift``). Defaults: guidance 3.5 and SDE noise level 0.9 (Flow-GRPO FLUX, ``config/grpo.py:pickscore_flux``
and its comment "In FLUX, 0.9"), LoRA r=64/α=128 with the FF layers added (``train_flux.py``), max_sequence_length 512.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from einops import rearrange
from torch import Tensor

from flowrl.policies import components as comp
from flowrl.policies.base import PolicyBase, cfg_combine, sigma_batch
from flowrl.policies.lora import FLUX_TARGETS, LoraConfig
from flowrl.types import Cond

HUB_IDS = {"flux.1-dev": "black-forest-labs/FLUX.1-dev"}

SPEC: comp.Spec = {
    "transformer": ("diffusers", "FluxTransformer2DModel"),
    "vae": ("diffusers", "AutoencoderKL"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "CLIPTextModel"),
    "text_encoder_2": ("transformers", "T5EncoderModel"),
    "tokenizer": comp.TOKENIZER, "tokenizer_2": comp.TOKENIZER,
}


@dataclass
class Config:
    guidance: float = 3.5                # distilled guidance embedding value
    true_cfg: float = 1.0                # > 1: real CFG against the negative prompt (2 forwards)
    max_sequence_length: int = 512
    lora: LoraConfig | None = field(default_factory=lambda: LoraConfig(rank=64, alpha=128,
                                                                       target_modules=FLUX_TARGETS))
    keep_base: bool = True
    gradient_checkpointing: bool = False


def pack_latents(x: Tensor) -> Tensor:
    """(B, C, H, W) → (B, (H/2)(W/2), 4C): 2×2 patches as tokens (diffusers ``FluxPipeline._pack_latents``)."""
    b, c, h, w = x.shape
    if h % 2 or w % 2:
        raise ValueError(f"FLUX latents need even height and width, got {h}×{w}")
    return rearrange(x, "b c (h p) (w q) -> b (h w) (c p q)", p=2, q=2)


def unpack_latents(tokens: Tensor, h: int, w: int) -> Tensor:
    """Inverse of ``pack_latents`` for latent height ``h`` and width ``w``."""
    return rearrange(tokens, "b (h w) (c p q) -> b c (h p) (w q)", h=h // 2, w=w // 2, p=2, q=2)


def latent_image_ids(h: int, w: int, device=None, dtype=torch.float32) -> Tensor:
    """(h/2·w/2, 3) position ids (0, row, col) of the packed tokens (``_prepare_latent_image_ids``)."""
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 1] = torch.arange(h // 2)[:, None]
    ids[..., 2] = torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3).to(device=device, dtype=dtype)


class FluxPolicy(PolicyBase):
    """FLUX.1-dev policy. Build with ``from_pretrained`` (hub id or local dir) or ``tiny()``."""

    family = "flux"
    pipeline_class = "FluxPipeline"
    shard_blocks = ("transformer_blocks", "single_transformer_blocks")   # FSDP units: both block lists
    spec = SPEC
    default_path = HUB_IDS["flux.1-dev"]
    config_class = Config

    def __init__(self, components: dict, config: Config | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None):
        from diffusers import FluxPipeline

        self._setup(components, config or Config(), device, dtype)
        self.pipe = FluxPipeline(**components)

    @classmethod
    def tiny(cls, seed: int = 0, config: Config | None = None, device: torch.device | str = "cpu") -> FluxPolicy:
        """Tiny offline FLUX (diffusers test sizes + guidance embedding, ``test_pipeline_flux.py``), float32."""
        from flowrl.policies.tiny import flux_components

        return cls(flux_components(seed), config or Config(), device, torch.float32)

    tiny_spatial_multiple = 2          # the tiny preset's VAE has factor 1; packing needs 2×2 latents

    @classmethod
    def _spatial_multiple_from(cls, vae: dict, transformer: dict) -> int:
        """2f: the VAE factor f = 2^(len(block_out_channels) − 1), times FLUX's 2×2 latent packing."""
        return 2 ** (len(vae["block_out_channels"]) - 1) * 2

    # ---- the Policy contract ------------------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """(C, H/f, W/f), C = in_channels/4; H and W must be multiples of 2f (packing needs even latents)."""
        if num_frames not in (None, 1):
            raise ValueError(f"FluxPolicy makes images; got num_frames={num_frames}")
        f = self.pipe.vae_scale_factor
        if height % (2 * f) or width % (2 * f):
            raise ValueError(f"height and width must be multiples of {2 * f} for FLUX, got {height}×{width}")
        return (self.transformer.config.in_channels // 4, height // f, width // f)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None,
               cfg: bool = True, images: Sequence | None = None) -> Cond:
        """``prompt_embeds`` (B, L, D) from T5 and ``pooled_prompt_embeds`` (B, 768) from CLIP (pipeline's
        encode_prompt). The uncond part is encoded only for true CFG (``Config.true_cfg > 1``)."""
        self.check_images(images, len(prompts))  # raises: this family takes no reference images
        prompts = list(prompts)
        embeds = self._encode(prompts)
        uncond = None
        if cfg and self.config.true_cfg > 1.0:
            uncond = self._encode(list(negative_prompts) if negative_prompts is not None else [""] * len(prompts))
        return Cond(embeds, uncond, prompts)

    def _encode(self, prompts: list[str]) -> dict[str, Tensor]:
        pe, ppe, _ = self.pipe.encode_prompt(prompt=prompts, prompt_2=None, device=self.device,
                                             max_sequence_length=self.config.max_sequence_length)
        return {"prompt_embeds": pe, "pooled_prompt_embeds": ppe}

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """FLUX pipeline grid: linspace(1, 1/N, N) with dynamic shift μ(image_seq_len = H/2·W/2)."""
        from samplers.schedule import flux_sigmas

        c = self.scheduler_config
        seq_len = (latents.shape[-2] // 2) * (latents.shape[-1] // 2)
        return flux_sigmas(num_steps, seq_len, c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                           c.get("base_shift", 0.5), c.get("max_shift", 1.15), device=latents.device)

    def velocity(self, x: Tensor, sigma: Tensor | float, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) float32 (B, C, H, W); ``guidance`` is the distilled guidance value (default 3.5)."""
        g = self.default_guidance if guidance is None else float(guidance)
        b, _, h, w = x.shape
        t = (sigma_batch(sigma, b, x.device) * 1000.0).to(self.dtype)
        g_t = torch.full((b,), g, device=x.device, dtype=torch.float32) if self._has_guidance_embed else None
        tokens = pack_latents(x).to(self.dtype)
        v = self._forward(tokens, t, g_t, cond.embeds, h, w)
        if self.config.true_cfg > 1.0 and cond.uncond is not None:   # pipeline: true_cfg_scale > 1 and negatives
            v = cfg_combine(v, self._forward(tokens, t, g_t, cond.uncond, h, w), self.config.true_cfg)
        return v

    @property
    def _has_guidance_embed(self) -> bool:
        return bool(self.transformer.config.guidance_embeds)

    def _forward(self, tokens: Tensor, t: Tensor, g: Tensor | None, embeds: dict, h: int, w: int) -> Tensor:
        pe = embeds["prompt_embeds"].to(self.dtype)
        txt_ids = torch.zeros(pe.shape[1], 3, device=tokens.device, dtype=self.dtype)
        out = self._transformer_module()(
            hidden_states=tokens, timestep=t / 1000, guidance=g,
            pooled_projections=embeds["pooled_prompt_embeds"].to(self.dtype), encoder_hidden_states=pe,
            txt_ids=txt_ids, img_ids=latent_image_ids(h, w, tokens.device, self.dtype), return_dict=False)[0]
        return unpack_latents(out.float(), h, w)

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Images (B, 3, H, W) in [0, 1]: ``vae.decode(z/scale + shift)`` then (x + 1)/2 clamped (pipeline)."""
        cfg = self.vae.config
        z = latents.to(self.vae.device, self.vae.dtype) / cfg.scaling_factor + cfg.shift_factor
        return (self.vae.decode(z, return_dict=False)[0].float() / 2 + 0.5).clamp(0, 1)
