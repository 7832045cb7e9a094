"""Qwen-Image (and -2512) as a flowrl policy: a 60-block double-stream MMDiT on a Qwen2.5-VL text encoder.

Components (diffusers ``QwenImagePipeline``): QwenImageTransformer2DModel, AutoencoderKLQwenImage (a Wan-style
causal 3-D VAE, 16 channels, per-channel ``latents_mean``/``latents_std``; an image is a one-frame video),
Qwen2_5_VLForConditionalGeneration + its tokenizer, FlowMatchEulerDiscreteScheduler with dynamic shifting.

Text: the pipeline's own ``encode_prompt`` (chat template, last hidden state, the template's first 34 tokens
dropped, padding removed and re-padded to the batch's longest prompt with ``prompt_embeds_mask``). Rows of
different chunks may differ in length; they are zero-padded (mask 0) and ``velocity`` trims the columns that are
padding in every row, so a row's velocity does not depend on its batch (text RoPE positions are per token).

Latents are exposed *unpacked*, (B, 16, H/8, W/8); ``velocity`` packs 2×2 patches into (B, HW/4, 64) tokens.
Velocity, as the pipeline's step (``pipeline_qwenimage.py``):

    v_c = F(pack(x), timestep = (1000σ)/1000, img_shapes = [(1, H/16, W/16)])
    true CFG (w > 1, a negative prompt given):  c = v_n + w·(v_c − v_n),   v = c · ‖v_c‖ / ‖c‖

with the norms over each token's 64 channels (the pipeline's rescale, computed on packed tokens).
σ grid: ``linspace(1, 1/N, N)`` shifted by e^μ/(e^μ + 1/σ − 1), μ linear in the token count HW/256
(``calculate_shift`` with the scheduler config's base/max seq len and shift), then the config's
``shift_terminal`` stretch (0.02 in the Qwen-Image scheduler config).
Decode: ``z·std + mean`` per channel (the pipeline's ``z / (1/std) + mean``), VAE decode, (x + 1)/2 clamped.

Defaults: true-CFG 4.0 (pipeline ``true_cfg_scale``; Flow-Factory ``grpo/lora/qwen_image/default.yaml`` CFG 4),
negative prompt " " (the pipeline docstring: an empty " " negative enables CFG), max_sequence_length 512
(pipeline ``__call__``), LoRA r=64/α=128 (Flow-Factory recipe) on attention + both MLP layers of each stream
(Flow-Factory's ``default_target_modules`` names ``img_mlp.net.2.proj``, which matches no diffusers module, so
its second MLP layers stay frozen; flowrl adapts ``img_mlp.net.2`` / ``txt_mlp.net.2``: a named departure).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.policies import components as comp
from flowrl.policies.base import PolicyBase, resolve_guidance, scheduler_sigmas, sigma_batch
from flowrl.policies.flux import pack_latents, unpack_latents
from flowrl.policies.lora import QWEN_IMAGE_TARGETS, LoraConfig
from flowrl.types import Cond

NEGATIVE = " "      # the uncond text when the caller gives none (the pipeline: " " enables CFG)
HUB_IDS = {"qwen-image": "Qwen/Qwen-Image", "qwen-image-2512": "Qwen/Qwen-Image-2512"}

SPEC: comp.Spec = {
    "transformer": ("diffusers", "QwenImageTransformer2DModel"),
    "vae": ("diffusers", "AutoencoderKLQwenImage"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Qwen2_5_VLForConditionalGeneration"),
    "tokenizer": comp.TOKENIZER,
}


@dataclass
class Config:
    guidance: float = 4.0                # true-CFG scale (pipeline true_cfg_scale), norm-rescaled
    max_sequence_length: int = 512
    lora: LoraConfig | None = field(default_factory=lambda: LoraConfig(rank=64, alpha=128,
                                                                       target_modules=QWEN_IMAGE_TARGETS))
    keep_base: bool = True
    gradient_checkpointing: bool = False


def rescaled_cfg(v_cond: Tensor, v_neg: Tensor, scale: float) -> Tensor:
    """Qwen-Image true CFG: c = v_n + w·(v_c − v_n), then c·‖v_c‖/‖c‖ with per-token norms over the last
    (channel) dimension (diffusers ``pipeline_qwenimage.py``, denoising loop)."""
    comb = v_neg + scale * (v_cond - v_neg)
    return comb * (torch.norm(v_cond, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))


def trim_text(embeds: Tensor, mask: Tensor) -> tuple[Tensor, Tensor | None]:
    """Drop the trailing columns that are padding (mask 0) in every row; mask None when nothing is padded
    (what ``encode_prompt`` returns for an all-ones mask)."""
    valid = mask.bool()
    cols = valid.any(0).nonzero()
    n = int(cols.max()) + 1 if cols.numel() else 1
    embeds, valid = embeds[:, :n], valid[:, :n]
    return embeds, (None if bool(valid.all()) else mask[:, :n])


class QwenImagePolicy(PolicyBase):
    """Qwen-Image text-to-image policy. Build with ``from_pretrained`` (hub id or local dir) or ``tiny()``."""

    family = "qwen_image"
    pipeline_class = "QwenImagePipeline"
    spec = SPEC
    config_class = Config
    accepts_images = False
    default_path = HUB_IDS["qwen-image"]

    def __init__(self, components: dict, config: Config | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None):
        import diffusers

        if components["transformer"].config.guidance_embeds:
            raise ValueError("this Qwen-Image transformer has guidance_embeds=True (a guidance-distilled variant); "
                             "flowrl's qwen_image policy supports the published guidance_embeds=False checkpoints")
        self._setup(components, config or self.config_class(), device, dtype)
        self.pipe = getattr(diffusers, self.pipeline_class)(**components)

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def tiny(cls, seed: int = 0, config: Config | None = None, device: torch.device | str = "cpu"):
        """Tiny offline Qwen-Image (diffusers ``tests/pipelines/qwenimage`` sizes, a byte-level BPE tokenizer with
        the chat special tokens, a 2-layer Qwen2.5-VL), float32."""
        from flowrl.policies.tiny_qwen import qwen_image_components

        return cls(qwen_image_components(seed, edit=cls.accepts_images), config or cls.config_class(), device,
                   torch.float32)

    tiny_spatial_multiple = 8          # tiny VAE factor 4 × the 2×2 packing

    @classmethod
    def _spatial_multiple_from(cls, vae: dict, transformer: dict) -> int:
        """2^len(temperal_downsample) (the pipeline's ``vae_scale_factor``) × the 2×2 latent packing."""
        return 2 ** len(vae.get("temperal_downsample", [False, True, True])) * 2

    # ---- the Policy contract ------------------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """(C, H/f, W/f), C = in_channels/4; H and W must be multiples of 2f (packing needs even latents)."""
        if num_frames not in (None, 1):
            raise ValueError(f"{type(self).__name__} makes images; got num_frames={num_frames}")
        f = self.pipe.vae_scale_factor
        if height % (2 * f) or width % (2 * f):
            raise ValueError(f"height and width must be multiples of {2 * f} for Qwen-Image, got {height}×{width}")
        return (self.transformer.config.in_channels // 4, height // f, width // f)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None, cfg: bool = True,
               images: Sequence | None = None) -> Cond:
        """``prompt_embeds`` (B, L, D) and ``prompt_embeds_mask`` (B, L) from the pipeline's encode_prompt;
        uncond from ``negative_prompts`` (default " ")."""
        prompts = list(prompts)
        self.check_images(images, len(prompts))
        negs = list(negative_prompts) if negative_prompts is not None else [NEGATIVE] * len(prompts)
        return Cond(self._encode(prompts), self._encode(negs) if cfg else None, prompts)

    def _encode(self, prompts: list[str], **kw) -> dict[str, Tensor]:
        pe, mask = self.pipe.encode_prompt(prompt=prompts, device=self.device,
                                           max_sequence_length=self.config.max_sequence_length, **kw)
        if mask is None:
            mask = torch.ones(pe.shape[:2], dtype=torch.long, device=pe.device)
        return {"prompt_embeds": pe, "prompt_embeds_mask": mask}

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """The pipeline's grid: custom linspace(1, 1/N, N), μ = calculate_shift(H/2·W/2 tokens), the scheduler
        config's dynamic shift and ``shift_terminal`` (pipeline ``__call__`` step 5)."""
        from samplers.schedule import calculate_shift, np_linspace

        c = self.scheduler_config
        if num_steps < 2 and c.get("shift_terminal"):
            raise ValueError(f"num_steps={num_steps}: this scheduler config's shift_terminal stretch needs at least "
                             "2 steps (with 1 it divides by 1 − σ_last = 0, NaN in the pipeline too)")
        mu = calculate_shift((latents.shape[-2] // 2) * (latents.shape[-1] // 2), c.get("base_image_seq_len", 256),
                             c.get("max_image_seq_len", 4096), c.get("base_shift", 0.5), c.get("max_shift", 1.15))
        base = np_linspace(1.0, 1 / num_steps, num_steps).tolist()
        return scheduler_sigmas(c, num_steps, mu=mu, sigmas=base).to(latents.device)

    def velocity(self, x: Tensor, sigma: Tensor | float, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) float32 (B, C, H, W); norm-rescaled true CFG with a second forward when w > 1."""
        w, use_cfg = resolve_guidance(guidance, self.default_guidance, cond)
        b, _, h, wd = x.shape
        t = (sigma_batch(sigma, b, x.device) * 1000.0).to(self.dtype)
        tokens = pack_latents(x).to(self.dtype)
        v = self._forward(tokens, t, cond.embeds, cond.embeds, h, wd)
        if use_cfg:
            v = rescaled_cfg(v, self._forward(tokens, t, cond.uncond, cond.embeds, h, wd), w)
        return unpack_latents(v, h, wd)

    def _image_tokens(self, image: dict, h: int, w: int) -> tuple[Tensor | None, list[tuple[int, int, int]]]:
        """Reference tokens appended after the noisy ones and their grids (none for text-to-image)."""
        return None, []

    def _forward(self, tokens: Tensor, t: Tensor, text: dict, image: dict, h: int, w: int) -> Tensor:
        pe, mask = trim_text(text["prompt_embeds"].to(self.dtype), text["prompt_embeds_mask"])
        ref, ref_shapes = self._image_tokens(image, h, w)
        n = tokens.shape[1]
        hidden = tokens if ref is None else torch.cat([tokens, ref.to(self.dtype)], dim=1)
        shapes = [[(1, h // 2, w // 2), *ref_shapes]] * tokens.shape[0]
        out = self._transformer_module()(hidden_states=hidden, timestep=t / 1000, guidance=None,
                                         encoder_hidden_states_mask=mask, encoder_hidden_states=pe,
                                         img_shapes=shapes, return_dict=False)[0]
        return out[:, :n].float()

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Images (B, 3, H, W) in [0, 1]: ``vae.decode(z / (1/std) + mean)`` on one frame, (x + 1)/2 clamped."""
        cfg = self.vae.config
        shape = (1, cfg.z_dim, 1, 1, 1)
        z = latents.to(self.vae.device, self.vae.dtype).unsqueeze(2)
        mean = torch.tensor(cfg.latents_mean).view(shape).to(z.device, z.dtype)
        inv_std = 1.0 / torch.tensor(cfg.latents_std).view(shape).to(z.device, z.dtype)
        image = self.vae.decode(z / inv_std + mean, return_dict=False)[0][:, :, 0]
        return (image.float() / 2 + 0.5).clamp(0, 1)
