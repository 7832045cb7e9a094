"""Wan2.2 as flowrl policies: the A14B text-/image-to-video mixture of two experts, and TI2V-5B.

Same components as Wan2.1 (``wan.py``: UMT5 text, AutoencoderKLWan, WanTransformer3DModel, t = 1000·σ, CFG
``v_u + w·(v_c − v_u)``), plus, as diffusers' ``pipeline_wan.py`` / ``pipeline_wan_i2v.py`` run them:

* A14B experts: ``transformer`` (high noise) runs where t ≥ boundary_ratio·1000, ``transformer_2`` (low noise)
  below, with its own CFG scale ``guidance_2`` (None → the same w, the pipeline's ``guidance_scale_2`` default).
  The expert is picked per row, so a batch of mixed σ (decoupled training timesteps) is split between the two.
* I2V-A14B: the first frame, VAE-encoded in a video of F frames with zeros after it and normalised
  ``(z − mean)/std``, plus a 4-channel first-frame mask, is concatenated on channels: input 16 + 4 + 16 = 36.
* TI2V-5B (``expand_timesteps``): its own VAE (48 channels, ×16 space); per-token timesteps
  ``t·mask`` (B, F'·H'·W'/4); image-to-video blends the clean first latent frame c into the input,
  ``(1 − m)·c + m·x``, and gives its tokens t = 0. Deviation, on that frame only: the pipeline steps it with the
  model's output and overwrites it with c after the loop; flowrl returns the exact velocity of a known x0 there,
  ``v = (x − c)/σ``, so every ODE step keeps it on the path to c and the final latents equal the pipeline's
  without a re-blend (decode needs no conditioning). Its SDE log-prob terms do not depend on θ (they cancel in
  ratios; with ``log_prob_reduce: mean`` they dilute the log-ratio by 1/F').

Image conditioning: ``encode(..., images=...)`` stores each row's first image (3, H, W) in [0, 1] as
``Cond.embeds["image"]`` and a 0/1 ``"has_image"``; the VAE latents are made by the pipeline's own
``prepare_latents`` at the latents' size on the first ``velocity`` call and cached in ``Cond.embeds``.
Defaults (Flow-Factory ``examples/grpo/full/wan22/t2v.yaml``, commit 5f6cda1): CFG 5.0 for both experts, only
``transformer`` (the high-noise expert, where its SDE steps 1–2 fall) trained, LoRA r32/α64 on attention + FFN.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.policies import components as comp
from flowrl.policies.base import cfg_combine, resolve_guidance, sigma_batch
from flowrl.policies.wan import SPEC, WanPolicy, euler_scheduler_from_config
from flowrl.policies.wan import Config as WanConfig
from flowrl.types import Cond, attach_first_frames

HUB_IDS = {"wan22": "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "wan22_i2v": "Wan-AI/Wan2.2-I2V-A14B-Diffusers",
           "wan22_ti2v": "Wan-AI/Wan2.2-TI2V-5B-Diffusers"}
EXPERTS = ("transformer", "transformer_2")


@dataclass
class Config(WanConfig):
    guidance_2: float | None = None          # low-noise expert's CFG scale; None → the high-noise expert's w
    train_experts: tuple[str, ...] = ("transformer",)   # Flow-Factory trains the high-noise expert only
    flow_shift: float | None = None          # static σ shift; None → the checkpoint scheduler's (Flow-Factory: 3.0)


class Wan22Policy(WanPolicy):
    """Wan2.2-T2V-A14B: two experts switched at the boundary. ``from_pretrained`` or ``tiny()``."""

    family = "wan22"
    pipeline_class = "WanPipeline"
    config_class = Config
    accepts_images = False
    transformer_components = EXPERTS

    def __init__(self, components: dict, config: Config | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None, boundary_ratio: float | None = None, expand_timesteps: bool = False):
        import diffusers

        parts = {k: v for k, v in components.items() if v is not None}
        self.experts = tuple(e for e in EXPERTS if e in parts)
        self.transformer_components = self.experts
        self._setup(parts, config or Config(), device, dtype)
        if self.config.flow_shift is not None:          # the grid only: the pipeline keeps its own scheduler
            self.scheduler_config["shift"] = float(self.config.flow_shift)
        flags = {"boundary_ratio": boundary_ratio, "expand_timesteps": expand_timesteps}
        self.pipe = getattr(diffusers, self.pipeline_class)(**parts, **flags)
        self.boundary = None if boundary_ratio is None else boundary_ratio * self.scheduler_config.get(
            "num_train_timesteps", 1000)
        if self.boundary is not None and "transformer_2" not in parts:
            raise ValueError("boundary_ratio is set but the checkpoint has no transformer_2 (low-noise expert)")

    def _make_weights(self, components: dict, config: Config):
        from flowrl.policies.experts import ExpertWeights

        trained = tuple(e for e in config.train_experts if e in self.experts) or self.experts[:1]
        return ExpertWeights({e: components[e] for e in self.experts}, trained, config.lora, config.keep_base)

    # ---- construction ------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | None = None, dtype: torch.dtype = torch.bfloat16,
                        device: torch.device | str = "cpu", config: Config | None = None) -> Wan22Policy:
        """Every component through its ``from_pretrained(path, subfolder=...)``; ``boundary_ratio`` and
        ``expand_timesteps`` from the checkpoint's model_index.json; the scheduler as flow-match Euler."""
        from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler

        path = path or HUB_IDS[cls.family]
        config = config or cls._saved_config(path)
        index = DiffusionPipeline.load_config(path)
        spec = {**SPEC, **{e: SPEC["transformer"] for e in EXPERTS if (index.get(e) or [None])[0]}}
        if not (index.get("transformer") or [None])[0]:
            spec.pop("transformer")
        parts = comp.load_components(path, spec, dtype, device, skip=("scheduler",))
        parts["scheduler"] = euler_scheduler_from_config(
            FlowMatchEulerDiscreteScheduler.load_config(path, subfolder="scheduler"))
        policy = cls(parts, config, device, dtype, index.get("boundary_ratio"), bool(index.get("expand_timesteps")))
        policy._load_saved_adapters(path)
        return policy

    tiny_variant = "t2v-a14b"

    @classmethod
    def tiny(cls, seed: int = 0, config: Config | None = None, device: torch.device | str = "cpu") -> Wan22Policy:
        """Tiny offline Wan2.2 of this class' variant (``tiny.wan22_components``), float32."""
        from flowrl.policies.tiny import wan22_components

        parts, flags = wan22_components(seed, cls.tiny_variant)
        return cls(parts, config or Config(), device, torch.float32, **flags)

    def save_pretrained(self, directory):
        """Diffusers layout with both experts' base weights, the pipeline flags, adapters, flowrl_policy.json."""
        from dataclasses import asdict

        parts = {k: v for k, v in self.pipe.components.items() if v is not None and (k in SPEC or k in EXPERTS)}
        flags = {"boundary_ratio": self.pipe.config.boundary_ratio,
                 "expand_timesteps": self.pipe.config.expand_timesteps}
        out = comp.save_components(directory, self.pipeline_class, parts, extra_index=flags,
                                   states=self.weights.base_state_dicts())
        comp.write_policy_config(out, {"family": self.family, "config": asdict(self.config)})
        for name in self._saved_weight_names():
            self.weights.save(comp.adapter_path(out, name), name)
        return out

    @classmethod
    def _saved_config(cls, path):
        config = super()._saved_config(path)
        if config is not None:
            config.train_experts = tuple(config.train_experts)
        return config

    @classmethod
    def _spatial_multiple_from(cls, vae: dict, transformer: dict) -> int:
        """The VAE's ``scale_factor_spatial`` (8; 16 for the TI2V-5B VAE) · the transformer's spatial patch."""
        factor = vae.get("scale_factor_spatial") or 2 ** len(vae.get("temperal_downsample", [False, True, True]))
        return factor * int(transformer["patch_size"][1])

    def enable_gradient_checkpointing(self, enabled: bool = True) -> None:
        """Per-block recomputation in every trained expert."""
        for w in self.weights.trained.values():
            m = w.transformer
            m.enable_gradient_checkpointing() if enabled else m.disable_gradient_checkpointing()

    # ---- conditioning ------------------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None, cfg: bool = True,
               images: Sequence | None = None) -> Cond:
        """UMT5 embeddings as Wan2.1; with ``images`` (length B, each a list of (3, H, W) [0, 1] tensors or None)
        the first image of each row goes to ``embeds["image"]`` (B, 3, H, W) with ``embeds["has_image"]`` (B,)."""
        cond = super().encode(prompts, negative_prompts, cfg)
        rows = self.check_images(images, len(prompts))      # None when no row carries an image
        if rows is None:
            if self.requires_images:
                raise ValueError(f"{self.family} is image-to-video: pass images=[...] (one first frame per prompt)")
            return cond
        firsts = [row[0] if row else None for row in rows]
        if self.requires_images and any(f is None for f in firsts):
            raise ValueError(f"{self.family} needs a first-frame image for every prompt")
        shapes = {tuple(f.shape) for f in firsts if f is not None}
        if len(shapes) > 1 or any(len(s) != 3 or s[0] != 3 for s in shapes):
            raise ValueError(f"images must be (3, H, W) tensors of one size per batch, got {sorted(shapes)}")
        return attach_first_frames(cond, firsts, self.device)

    requires_images = False

    def _i2v_pipe(self):
        from diffusers import WanImageToVideoPipeline

        if not hasattr(self, "_i2v"):
            parts = {k: v for k, v in self.pipe.components.items() if k in SPEC or k in EXPERTS}
            self._i2v = WanImageToVideoPipeline(**parts, boundary_ratio=self.pipe.config.boundary_ratio,
                                                expand_timesteps=self.pipe.config.expand_timesteps)
        return self._i2v

    @torch.no_grad()
    def image_condition(self, x: Tensor, cond: Cond) -> Tensor | None:
        """The image latents ``WanImageToVideoPipeline.prepare_latents`` makes for rows' first frames at x's size
        (A14B: mask + latents, (B, 20, F', H', W'); TI2V: (B, 48, F', H', W')), cached in ``cond.embeds``."""
        if "image" not in cond.embeds:
            return None
        cached = cond.embeds.get("image_condition")
        if cached is not None and cached.shape[0] == x.shape[0] and cached.shape[2:] == x.shape[2:]:
            return cached
        pipe = self._i2v_pipe()
        f, h, w = x.shape[2:]
        fs, ft = pipe.vae_scale_factor_spatial, pipe.vae_scale_factor_temporal
        rows = []
        for img in cond.embeds["image"]:
            pixels = pipe.video_processor.preprocess(img[None], height=h * fs, width=w * fs).to(x.device, torch.float32)
            out = pipe.prepare_latents(pixels, 1, x.shape[1], h * fs, w * fs, (f - 1) * ft + 1, torch.float32,
                                       x.device, None, torch.zeros_like(x[:1], dtype=torch.float32))
            rows.append(out[1])
        cond.embeds["image_condition"] = torch.cat(rows)
        return cond.embeds["image_condition"]

    def _token_mask(self, x: Tensor, cond: Cond) -> Tensor:
        """TI2V's first-frame mask m (B, 1, F', H', W'): 0 on an image row's first latent frame, else 1."""
        m = torch.ones(x.shape[0], 1, *x.shape[2:], device=x.device)
        if "has_image" in cond.embeds:
            m[:, :, 0] = 1.0 - cond.embeds["has_image"].to(x.device).view(-1, 1, 1, 1)
        return m

    # ---- velocity ----------------------------------------------------------------------------------------
    def velocity(self, x: Tensor, sigma: Tensor | float, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) (B, C, F', H', W') float32: each row through the expert its t = 1000·σ selects (t ≥ boundary →
        ``transformer``, scale w; else ``transformer_2``, scale ``guidance_2`` or w), CFG with separate forwards."""
        w, use_cfg = resolve_guidance(guidance, self.default_guidance, cond)
        sig = sigma_batch(sigma, x.shape[0], x.device)
        t = sig * 1000.0
        c = self.image_condition(x, cond)
        if self.pipe.config.expand_timesteps:
            m = self._token_mask(x, cond)
            x_in = x if c is None else (1 - m) * c + m * x
            p = self.experts_patch()
            ts = (m[:, 0, :, ::p[1], ::p[2]] * t.view(-1, 1, 1, 1)).flatten(1)
        else:
            x_in = x if c is None else torch.cat([x, c], dim=1)
            ts = t
        high = torch.ones_like(t, dtype=torch.bool) if self.boundary is None else t >= self.boundary
        v = None
        for expert, rows in (("transformer", high), ("transformer_2", ~high)):
            if not rows.any():
                continue
            scale = w if expert == "transformer" or self.config.guidance_2 is None else self.config.guidance_2
            idx = None if rows.all() else rows.nonzero().squeeze(1)
            part = self._expert_velocity(expert, x_in, ts, cond, idx, use_cfg, scale)
            if idx is None:
                v = part
            else:
                v = (torch.zeros_like(x, dtype=part.dtype) if v is None else v).index_put((idx,), part)
        if self.pipe.config.expand_timesteps and c is not None:   # the known clean frame: v = (x − c)/σ
            v = m * v + (1 - m) * (x - c) / sig.clamp_min(1e-6).view(-1, 1, 1, 1, 1)
        return v

    def experts_patch(self) -> tuple[int, int, int]:
        return tuple(self.weights.experts[self.experts[0]].config.patch_size)

    def _expert_velocity(self, expert: str, x_in: Tensor, ts: Tensor, cond: Cond, idx: Tensor | None,
                         use_cfg: bool, scale: float) -> Tensor:
        def rows(a: Tensor) -> Tensor:
            return a if idx is None else a[idx]

        module = self.weights.module(expert)
        xi, ti = rows(x_in).to(self.dtype), rows(ts)

        def forward(embeds: dict) -> Tensor:
            return module(hidden_states=xi, timestep=ti, encoder_hidden_states=rows(embeds["prompt_embeds"]).to(
                self.dtype), return_dict=False)[0].float()

        v = forward(cond.embeds)
        return cfg_combine(v, forward(cond.uncond), scale) if use_cfg else v


class Wan22I2VPolicy(Wan22Policy):
    """Wan2.2-I2V-A14B: two experts, first-frame latents + mask concatenated on channels (36 input channels)."""

    family = "wan22_i2v"
    pipeline_class = "WanImageToVideoPipeline"
    accepts_images = True
    requires_images = True
    tiny_variant = "i2v-a14b"


class Wan22TI2VPolicy(Wan22Policy):
    """Wan2.2-TI2V-5B: one transformer, the 48-channel ×16 VAE, per-token timesteps, optional first frame."""

    family = "wan22_ti2v"
    accepts_images = True
    tiny_variant = "ti2v-5b"
    spatial_multiple = 32
    tiny_spatial_multiple = 32
