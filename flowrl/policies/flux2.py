"""FLUX.2 [dev] and FLUX.2 [klein] as flowrl policies: one transformer class, two text encoders, two guidance styles.

Components (diffusers ``Flux2Pipeline`` / ``Flux2KleinPipeline``): Flux2Transformer2DModel, AutoencoderKLFlux2
(32 latent channels and a BatchNorm ``vae.bn`` whose running statistics normalise the patchified latents),
FlowMatchEulerDiscreteScheduler; dev reads Mistral Small 3 (Mistral3ForConditionalGeneration + PixtralProcessor,
hidden states 10, 20, 30 stacked per token), klein Qwen3 (Qwen3ForCausalLM, chat template with
``enable_thinking=False``, hidden states 9, 18, 27). Both through the pipeline's own ``encode_prompt``.

Latents are the pipeline's *patchified, BN-normalised* latents (B, 4·C_vae, H/2f, W/2f), the space the flow runs in
(``prepare_latents`` draws its noise there). ``velocity`` flattens them to tokens (``_pack_latents``), appends any
reference-image tokens, and reads back the first h·w output tokens (``pipeline_flux2.py`` denoising loop):

    v = F([x; x_ref], timestep = (1000σ)/1000, guidance = g | None, txt_ids = (0,0,0,l), img_ids = (0,i,j,0) ; ref ids)

dev: g is the distilled guidance fed to the guidance embedding (one forward). klein: no embedding; the base
(undistilled) model uses true CFG v = v_neg + w·(v − v_neg) against "" for w > 1, the distilled one ignores w.
σ grid: ``linspace(1, 1/N, N)`` shifted by e^μ/(e^μ + 1/σ − 1) with μ = ``compute_empirical_mu(h·w, N)``, piecewise
linear in the token count *and* the step count (so every step count has its own grid, as in the pipeline).
Decode: z·√(var + eps) + mean (``vae.bn``), unpatchify 2×2, ``vae.decode``.
Reference images: ``encode(..., images=rows)``, each a list of (3, H, W) tensors in [0, 1]; each image is
VAE-encoded (distribution mode), patchified, normalised and packed, with ids (10 + 10k, i, j, 0) for the k-th
image (``prepare_image_latents`` / ``_prepare_image_ids``); the tokens ride in ``Cond.embeds``.
Defaults: guidance 4.0 (both pipelines' signature default), max_sequence_length 512, LoRA r=64/α=128 on every
attention and feed-forward projection (Flow-Factory ``grpo/lora/flux2_klein_base/default.yaml`` r/α; the module list
is the union of both block kinds' projections), SDE noise level 0.7 in the recipes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.policies import components as comp
from flowrl.policies.base import PolicyBase, cfg_combine, resolve_guidance, scheduler_sigmas, sigma_batch
from flowrl.policies.lora import FLUX2_TARGETS, LoraConfig
from flowrl.types import Cond

HUB_IDS = {"flux.2-dev": "black-forest-labs/FLUX.2-dev", "flux.2-klein-4b": "black-forest-labs/FLUX.2-klein-4B",
           "flux.2-klein-base-4b": "black-forest-labs/FLUX.2-klein-base-4B",
           "flux.2-klein-base-9b": "black-forest-labs/FLUX.2-klein-base-9B"}
MAX_REFERENCE_AREA = 1024 * 1024        # the pipelines resize larger condition images down to this area
REF_KEYS = ("ref_tokens", "ref_hw")


def _lora() -> LoraConfig:
    return LoraConfig(rank=64, alpha=128, target_modules=FLUX2_TARGETS)


@dataclass
class Config:
    guidance: float = 4.0                 # dev: distilled guidance embedding; klein base: true-CFG scale
    max_sequence_length: int = 512
    text_encoder_out_layers: tuple[int, ...] = (10, 20, 30)    # Mistral3 hidden states stacked per token
    lora: LoraConfig | None = field(default_factory=_lora)
    keep_base: bool = True
    gradient_checkpointing: bool = False


@dataclass
class KleinConfig:
    guidance: float = 4.0                 # true CFG scale (base checkpoints); distilled checkpoints ignore it
    max_sequence_length: int = 512
    text_encoder_out_layers: tuple[int, ...] = (9, 18, 27)     # Qwen3 hidden states stacked per token
    lora: LoraConfig | None = field(default_factory=_lora)
    keep_base: bool = True
    gradient_checkpointing: bool = False


def pack(x: Tensor) -> Tensor:
    """(B, C, h, w) → (B, h·w, C), row-major tokens (``Flux2Pipeline._pack_latents``)."""
    return x.flatten(2).transpose(1, 2)


def unpack(tokens: Tensor, h: int, w: int) -> Tensor:
    """Inverse of ``pack`` (the pipeline's ``_unpack_latents_with_ids`` for its own row-major ids)."""
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], h, w)


def latent_ids(h: int, w: int, t: int = 0, device=None) -> Tensor:
    """(h·w, 4) position ids (t, row, col, 0) (``_prepare_latent_ids``; references use t = 10 + 10k)."""
    ids = torch.cartesian_prod(torch.tensor([t]), torch.arange(h), torch.arange(w), torch.arange(1))
    return ids.to(device)


def text_ids(length: int, device=None) -> Tensor:
    """(L, 4) ids (0, 0, 0, l) of the prompt tokens (``_prepare_text_ids``)."""
    return torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(length)).to(device)


def reference_ids(hws: Sequence[tuple[int, int]], device=None) -> Tensor:
    """Ids of reference images with latent sizes ``hws``: image k gets t = 10 + 10k (``_prepare_image_ids``)."""
    return torch.cat([latent_ids(h, w, 10 + 10 * k, device) for k, (h, w) in enumerate(hws)])


class Flux2Policy(PolicyBase):
    """FLUX.2 [dev] policy (``Flux2Pipeline``). Build with ``from_pretrained`` (hub id or local dir) or ``tiny()``."""

    family = "flux2"
    pipeline_class = "Flux2Pipeline"
    shard_blocks = ("transformer_blocks", "single_transformer_blocks")
    spec: comp.Spec = {"transformer": ("diffusers", "Flux2Transformer2DModel"),
                       "vae": ("diffusers", "AutoencoderKLFlux2"),
                       "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
                       "text_encoder": ("transformers", "Mistral3ForConditionalGeneration"),
                       "tokenizer": ("transformers", "AutoProcessor")}
    config_class = Config
    default_path = HUB_IDS["flux.2-dev"]
    accepts_images = True
    tiny_spatial_multiple = 2           # tiny VAE factor 1 × the 2×2 patchify

    def __init__(self, components: dict, config=None, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None, **pipeline_kwargs):
        import diffusers

        self._setup(components, config or self.config_class(), device, dtype)
        self.pipe = getattr(diffusers, self.pipeline_class)(**components, **pipeline_kwargs)

    @classmethod
    def tiny(cls, seed: int = 0, config=None, device: torch.device | str = "cpu"):
        """Tiny offline FLUX.2 (``tiny_chat.flux2_components``), float32, random weights."""
        from flowrl.policies.tiny_chat import flux2_components

        return cls(flux2_components(seed, klein=cls.family != "flux2"), config, device, torch.float32)

    @classmethod
    def _spatial_multiple_from(cls, vae: dict, transformer: dict) -> int:
        """2f: the VAE factor f = 2^(len(block_out_channels) − 1) times the 2×2 patchify."""
        return 2 ** (len(vae["block_out_channels"]) - 1) * 2

    # ---- the Policy contract ------------------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """(in_channels, H/2f, W/2f): the patchified latent grid; H and W must be multiples of 2f."""
        self.check_frames(num_frames)
        m = 2 * self.pipe.vae_scale_factor
        if height % m or width % m:
            raise ValueError(f"height and width must be multiples of {m} for {self.family}, got {height}×{width}")
        return (self.transformer.config.in_channels, height // m, width // m)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None, cfg: bool = True,
               images: Sequence[Sequence[Tensor] | None] | None = None) -> Cond:
        """``prompt_embeds`` (B, L, 3·D_text) from the pipeline's ``encode_prompt``; the uncond part only where the
        family runs a negative branch (``_uses_cfg``); reference-image tokens from ``images`` (see module doc)."""
        prompts = list(prompts)
        embeds = {"prompt_embeds": self._encode(prompts)}
        uncond = None
        if cfg and self._uses_cfg:
            neg = list(negative_prompts) if negative_prompts is not None else [""] * len(prompts)
            if len(neg) != len(prompts):
                raise ValueError(f"got {len(neg)} negative prompts for {len(prompts)} prompts")
            uncond = {"prompt_embeds": self._encode(neg)}
        images = self.check_images(images, len(prompts))
        if images is not None:
            embeds.update(self.encode_references(images, len(prompts)))
        return Cond(embeds, uncond, prompts)

    _uses_cfg = False                   # dev: guidance is an embedding, there is no negative branch

    def _encode(self, prompts: list[str]) -> Tensor:
        pe, _ = self.pipe.encode_prompt(prompt=prompts, device=self.device,
                                        max_sequence_length=self.config.max_sequence_length,
                                        text_encoder_out_layers=tuple(self.config.text_encoder_out_layers))
        return pe

    @torch.no_grad()
    def encode_references(self, images: Sequence[Sequence[Tensor] | None], batch: int) -> dict[str, Tensor]:
        """Rows of reference images → ``ref_tokens`` (B, N_max, C) zero-padded and ``ref_hw`` (B, K_max, 2), the
        latent size of each row's k-th image ((0, 0) where a row has fewer)."""
        if len(images) != batch:
            raise ValueError(f"images must have one entry (a list of images or None) per prompt: got {len(images)} "
                             f"for {batch} prompts")
        rows = [self._encode_row(r) for r in images]
        n, k = max([t.shape[0] for t, _ in rows] + [0]), max([len(hw) for _, hw in rows] + [0])
        c = self.transformer.config.in_channels
        tokens = torch.zeros(batch, n, c, device=self.device)
        hw = torch.zeros(batch, k, 2, dtype=torch.long, device=self.device)
        for b, (t, sizes) in enumerate(rows):
            tokens[b, :t.shape[0]] = t
            if sizes:
                hw[b, :len(sizes)] = torch.tensor(sizes, device=self.device)
        return {"ref_tokens": tokens, "ref_hw": hw}

    def _encode_row(self, row: Sequence[Tensor] | None) -> tuple[Tensor, list[tuple[int, int]]]:
        if not row:
            return torch.zeros(0, self.transformer.config.in_channels, device=self.device), []
        m, vae = 2 * self.pipe.vae_scale_factor, self.vae
        tokens, sizes = [], []
        for img in row:
            if not isinstance(img, Tensor) or img.dim() != 3 or img.shape[0] != 3:
                raise ValueError(f"a reference image must be a (3, H, W) tensor, got "
                                 f"{tuple(img.shape) if isinstance(img, Tensor) else type(img).__name__}")
            h, w = img.shape[1:]
            if h % m or w % m or min(h, w) < 64 or max(h / w, w / h) > 8 or h * w > MAX_REFERENCE_AREA:
                raise ValueError(f"reference image {h}×{w}: H and W must be multiples of {m}, at least 64, aspect "
                                 "≤ 8 and H·W ≤ 1024² (Flux2ImageProcessor.check_image_input; resize it first)")
            x = (2 * img.float() - 1)[None].to(vae.device, vae.dtype)        # VaeImageProcessor.normalize
            z = self.pipe._encode_vae_image(image=x, generator=None)           # mode, patchify, BN-normalise
            tokens.append(pack(z)[0].float().to(self.device))
            sizes.append((z.shape[2], z.shape[3]))
        return torch.cat(tokens), sizes

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """The pipeline's grid: linspace(1, 1/N, N), μ = compute_empirical_mu(h·w, N), the scheduler's shift."""
        import numpy as np
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        mu = compute_empirical_mu(image_seq_len=latents.shape[-2] * latents.shape[-1], num_steps=num_steps)
        return scheduler_sigmas(self.scheduler_config, num_steps, mu=mu,
                                sigmas=np.linspace(1.0, 1 / num_steps, num_steps)).to(latents.device)

    def velocity(self, x: Tensor, sigma: Tensor | float, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) float32 (B, C, h, w); dev: ``guidance`` is the embedded value (default 4.0), one forward."""
        g = self.default_guidance if guidance is None else float(guidance)
        b = x.shape[0]
        g_t = torch.full((b,), g, device=x.device, dtype=torch.float32) if self._guidance_embeds else None
        return self._run(x, sigma, cond, g_t, cfg_scale=None)

    @property
    def _guidance_embeds(self) -> bool:
        return self.transformer.time_guidance_embed.guidance_embedder is not None

    def _run(self, x: Tensor, sigma, cond: Cond, g: Tensor | None, cfg_scale: float | None) -> Tensor:
        """Forward rows grouped by their reference layout (rows of a group share position ids, as the
        transformer needs); with ``cfg_scale`` a second forward on ``cond.uncond`` and v_u + w(v_c − v_u)."""
        b, _, h, w = x.shape
        t = (sigma_batch(sigma, b, x.device) * 1000.0).to(self.dtype)
        tokens, out = pack(x).to(self.dtype), torch.empty_like(x, dtype=torch.float32)
        for rows, hws in self._reference_groups(cond, b):
            n = sum(hh * ww for hh, ww in hws)
            seq, ids = tokens[rows], latent_ids(h, w, device=x.device)
            if n:
                seq = torch.cat([seq, cond.embeds["ref_tokens"][rows, :n].to(self.dtype)], dim=1)
                ids = torch.cat([ids, reference_ids(hws, x.device)])
            gr = None if g is None else g[rows]
            v = self._forward(seq, t[rows], gr, cond.embeds["prompt_embeds"][rows], ids)[:, :h * w]
            if cfg_scale is not None:
                v_u = self._forward(seq, t[rows], gr, cond.uncond["prompt_embeds"][rows], ids)[:, :h * w]
                v = cfg_combine(v, v_u, cfg_scale)
            out[rows] = unpack(v, h, w)
        return out

    @staticmethod
    def _reference_groups(cond: Cond, b: int) -> list[tuple[Tensor, list[tuple[int, int]]]]:
        """(row indices, reference latent sizes) per distinct reference layout; one group without references."""
        if "ref_hw" not in cond.embeds:
            return [(torch.arange(b), [])]
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(cond.embeds["ref_hw"].tolist()):
            groups.setdefault(tuple((hh, ww) for hh, ww in row if hh * ww), []).append(i)
        return [(torch.tensor(rows), list(key)) for key, rows in groups.items()]

    def _forward(self, seq: Tensor, t: Tensor, g: Tensor | None, pe: Tensor, ids: Tensor) -> Tensor:
        pe = pe.to(self.dtype)
        return self._transformer_module()(
            hidden_states=seq, timestep=t / 1000, guidance=g, encoder_hidden_states=pe,
            txt_ids=text_ids(pe.shape[1], seq.device), img_ids=ids, return_dict=False)[0].float()

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Images (B, 3, H, W) in [0, 1]: BN-denormalise, unpatchify, ``vae.decode``, (x + 1)/2 clamped."""
        z = latents.to(self.vae.device, self.vae.dtype)
        bn = self.vae.bn
        z = z * torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps).to(z.dtype) \
            + bn.running_mean.view(1, -1, 1, 1).to(z.dtype)
        z = self.pipe._unpatchify_latents(z)
        return (self.vae.decode(z, return_dict=False)[0].float() / 2 + 0.5).clamp(0, 1)


class Flux2KleinPolicy(Flux2Policy):
    """FLUX.2 [klein] policy (``Flux2KleinPipeline``): Qwen3 text, true CFG on the base checkpoints."""

    family = "flux2_klein"
    pipeline_class = "Flux2KleinPipeline"
    spec: comp.Spec = {**Flux2Policy.spec, "text_encoder": ("transformers", "Qwen3ForCausalLM"),
                       "tokenizer": comp.TOKENIZER}
    config_class = KleinConfig
    default_path = HUB_IDS["flux.2-klein-base-4b"]

    @classmethod
    def _pipeline_kwargs(cls, path) -> dict:
        """``is_distilled`` from the checkpoint's model_index.json (the pipeline's registered config)."""
        from diffusers import DiffusionPipeline

        return {"is_distilled": bool(DiffusionPipeline.load_config(path).get("is_distilled", False))}

    @property
    def is_distilled(self) -> bool:
        return bool(self.pipe.config.is_distilled)

    @property
    def _uses_cfg(self) -> bool:        # the pipeline's do_classifier_free_guidance, less the scale test
        return not self.is_distilled

    def velocity(self, x: Tensor, sigma: Tensor | float, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) float32; base: v_neg + w(v − v_neg) when w > 1 (two forwards); distilled: w ignored."""
        if self.is_distilled:
            return self._run(x, sigma, cond, None, cfg_scale=None)
        w, use_cfg = resolve_guidance(guidance, self.default_guidance, cond)
        return self._run(x, sigma, cond, None, cfg_scale=w if use_cfg else None)

    def save_pretrained(self, directory):
        """``PolicyBase.save_pretrained`` plus ``is_distilled`` in model_index.json (read back by both loaders)."""
        import json
        from pathlib import Path

        out = super().save_pretrained(directory)
        index = Path(out) / "model_index.json"
        index.write_text(json.dumps({**json.loads(index.read_text()), "is_distilled": self.is_distilled}, indent=2))
        return out
