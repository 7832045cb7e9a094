"""HunyuanVideo-1.5 (8.3B) text-to-video as a flowrl policy, as diffusers' ``pipeline_hunyuan_video1_5.py`` runs it.

Components (``HunyuanVideo15Pipeline``): HunyuanVideo15Transformer3DModel (54 double-stream blocks), Qwen2.5-VL text
model (chat template with a system message, hidden state −3, first 108 template tokens cropped, 1000 tokens), a
ByT5 glyph encoder on quoted text (zeros when there is none), AutoencoderKLHunyuanVideo15 (32 channels, ×16 space,
×4 time), the scheduler and a ``ClassifierFreeGuidance`` guider. Latents (B, 32, (F−1)/4 + 1, H/16, W/16).
Velocity, one step of the pipeline (model input ``cat([x, 0, 0])``: text-to-video's zero condition latents and
mask, 32 + 32 + 1 = 65 channels; zero SigLIP image embeddings):

    t = 1000·σ,   v = v_u + w·(v_c − v_u)   (the guider; ``use_original_formulation``: v_c + w·(v_c − v_u)),
    then ``rescale_noise_cfg(v, v_c, guidance_rescale)`` when the guider sets a rescale

σ grid: ``sigmas = linspace(1, 0, N + 1)[:-1]`` shifted by the scheduler's static ``shift``, then 0.
Decode: ``vae.decode(z / scaling_factor)``, (x + 1)/2 clamped → (B, F, 3, H, W).
Defaults: CFG from the checkpoint's guider (``guidance: null``); LoRA r32/α64 (Flow-GRPO's) on the blocks' attention
and FFN names (diffusers ``transformer_hunyuan_video15.py``; the text token refiner's ``attn`` matches them too).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.policies import components as comp
from flowrl.policies.base import PolicyBase, resolve_guidance, scheduler_sigmas, sigma_batch
from flowrl.policies.lora import FLUX_TARGETS, LoraConfig
from flowrl.types import Cond

HUB_ID = "hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v"
SPEC: comp.Spec = {
    "transformer": ("diffusers", "HunyuanVideo15Transformer3DModel"),
    "vae": ("diffusers", "AutoencoderKLHunyuanVideo15"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Qwen2_5_VLTextModel"),
    "tokenizer": comp.TOKENIZER,
    "text_encoder_2": ("transformers", "T5EncoderModel"),
    "tokenizer_2": comp.TOKENIZER,
    "guider": ("diffusers", "ClassifierFreeGuidance"),
}
EMBEDS = ("encoder_hidden_states", "encoder_attention_mask", "encoder_hidden_states_2", "encoder_attention_mask_2")


@dataclass
class Config:
    guidance: float | None = None           # None → the checkpoint guider's guidance_scale
    max_sequence_length: int = 1000         # Qwen tokens after the 108 cropped template tokens (pipeline's 1000)
    lora: LoraConfig | None = field(default_factory=lambda: LoraConfig(rank=32, alpha=64, target_modules=FLUX_TARGETS))
    keep_base: bool = True
    gradient_checkpointing: bool = False


class HunyuanVideo15Policy(PolicyBase):
    """HunyuanVideo-1.5 T2V policy. Build with ``from_pretrained`` (hub id or local dir) or ``tiny()``."""

    family = "hunyuan15"
    pipeline_class = "HunyuanVideo15Pipeline"
    spec = SPEC
    config_class = Config
    temporal_factor = 4
    spatial_multiple = 16
    tiny_spatial_multiple = 4

    def __init__(self, components: dict, config: Config | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None):
        from dataclasses import replace

        from diffusers import HunyuanVideo15Pipeline

        config = config or Config()
        guider = components["guider"]
        self._setup(components, replace(config, guidance=config.guidance or guider.guidance_scale), device, dtype)
        self.config = config
        self.pipe = HunyuanVideo15Pipeline(**components)
        self.pipe.tokenizer_max_length = config.max_sequence_length

    @classmethod
    def from_pretrained(cls, path: str = HUB_ID, dtype: torch.dtype = torch.bfloat16,
                        device: torch.device | str = "cpu", config: Config | None = None) -> HunyuanVideo15Policy:
        """Every component through its ``from_pretrained(path, subfolder=...)``; VAE kept float32."""
        config = config or cls._saved_config(path)
        policy = cls(comp.load_components(path, SPEC, dtype, device), config, device, dtype)
        policy._load_saved_adapters(path)
        return policy

    @classmethod
    def tiny(cls, seed: int = 0, config: Config | None = None,
             device: torch.device | str = "cpu") -> HunyuanVideo15Policy:
        """Tiny offline HunyuanVideo-1.5 (``tiny.hunyuan15_components``), float32."""
        from flowrl.policies.tiny import hunyuan15_components

        return cls(hunyuan15_components(seed), config or Config(), device, torch.float32)

    @classmethod
    def _spatial_multiple_from(cls, vae: dict, transformer: dict) -> int:
        return int(vae.get("spatial_compression_ratio", 16)) * int(transformer.get("patch_size", 1))

    @classmethod
    def check_frames(cls, num_frames: int | None) -> None:
        """Videos of F frames with F − 1 divisible by the temporal factor 4 (e.g. 121)."""
        if num_frames is None or num_frames < 1 or (num_frames - 1) % cls.temporal_factor:
            raise ValueError(f"num_frames: HunyuanVideo-1.5 makes videos of F frames with F − 1 divisible by "
                             f"{cls.temporal_factor} (e.g. 121), got {num_frames}")

    # ---- the Policy contract ------------------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """(32, (F−1)/4 + 1, H/16, W/16), factors and channels read from the VAE."""
        ft, fs = self.pipe.vae_scale_factor_temporal, self.pipe.vae_scale_factor_spatial
        if num_frames is None or (num_frames - 1) % ft:
            raise ValueError(f"num_frames − 1 must be divisible by {ft} for HunyuanVideo-1.5, got {num_frames}")
        if height % fs or width % fs:
            raise ValueError(f"height and width must be multiples of {fs} for HunyuanVideo-1.5, got {height}×{width}")
        return (self.vae.config.latent_channels, (num_frames - 1) // ft + 1, height // fs, width // fs)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None,
               cfg: bool = True, images: Sequence | None = None) -> Cond:
        """The pipeline's ``encode_prompt``: Qwen2.5-VL embeddings + mask, ByT5 glyph embeddings + mask; uncond
        from ``negative_prompts`` (default "", as the pipeline's)."""
        self.check_images(images, len(prompts))  # raises: text-to-video only
        prompts = list(prompts)

        def enc(texts):
            out = self.pipe.encode_prompt(prompt=texts, device=self.device, dtype=self.dtype, batch_size=len(texts))
            return dict(zip(EMBEDS, out, strict=True))

        neg = [""] * len(prompts) if negative_prompts is None else list(negative_prompts)
        return Cond(enc(prompts), enc(neg) if cfg else None, prompts)

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """``linspace(1, 0, N + 1)[:-1]`` through ``set_timesteps(sigmas=...)`` (static shift), then 0."""
        import numpy as np

        grid = np.linspace(1.0, 0.0, num_steps + 1)[:-1]
        return scheduler_sigmas(self.scheduler_config, num_steps, sigmas=grid).to(latents.device)

    def velocity(self, x: Tensor, sigma: Tensor | float, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) float32 (B, 32, F', H', W'): the guider's CFG over a cond and an uncond forward."""
        from diffusers.guiders.guider_utils import rescale_noise_cfg

        w, use_cfg = resolve_guidance(guidance, self.default_guidance, cond)
        t = sigma_batch(sigma, x.shape[0], x.device) * 1000.0
        zeros = torch.zeros(x.shape[0], x.shape[1] + 1, *x.shape[2:], device=x.device, dtype=x.dtype)
        x_in = torch.cat([x, zeros], dim=1).to(self.dtype)
        tc = self.transformer.config
        image = torch.zeros(x.shape[0], self.pipe.vision_num_semantic_tokens, tc.image_embed_dim,
                            device=x.device, dtype=self.dtype)
        v = self._forward(x_in, t.to(self.dtype), cond.embeds, image)
        if use_cfg:
            guider = self.pipe.guider
            v_u = self._forward(x_in, t.to(self.dtype), cond.uncond, image)
            v_c = v
            v = (v_c if guider.use_original_formulation else v_u) + w * (v_c - v_u)
            if guider.guidance_rescale > 0.0:
                v = rescale_noise_cfg(v, v_c, guider.guidance_rescale)
        return v

    def _forward(self, x: Tensor, t: Tensor, embeds: dict, image: Tensor) -> Tensor:
        kw = {k: embeds[k].to(self.dtype) for k in EMBEDS}
        out = self._transformer_module()(hidden_states=x, timestep=t, image_embeds=image, return_dict=False, **kw)[0]
        return out.float()

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Videos (B, F, 3, H, W) in [0, 1]: ``vae.decode(z / scaling_factor)``, (x + 1)/2 clamped (pipeline)."""
        z = latents.to(self.vae.device, self.vae.dtype) / self.vae.config.scaling_factor
        # one row at a time: the 0.42.1 VAE's mid-block attention mask breaks on batches > 1 (same values)
        video = torch.cat([self.vae.decode(row[None], return_dict=False)[0] for row in z])
        return (video.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4).contiguous()
