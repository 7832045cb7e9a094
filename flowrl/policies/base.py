"""The Policy contract (the ``Policy`` Protocol below is the whole contract): what every model family
(sd3, flux, wan, toy) provides.

A policy answers "what is v_θ(x, σ, c)" for one model family; samplers, objectives and the trainer only
talk to this contract, so model differences live in ``flowrl/policies/`` alone.

Adapters: peft *named* LoRA adapters on the transformer. ``"train"`` is the trainable adapter,
``"old"`` the sampling adapter (π_old, soft-updated towards "train"), and ``None`` is the frozen base with
all adapters disabled. ``with policy.adapter(name):`` switches which one ``velocity`` uses, without
copying weights; only the "train" adapter's parameters ever require grad.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from flowrl.types import Cond, check_images


@runtime_checkable
class Policy(Protocol):
    """Everything the loop, the samplers, the objectives, evaluation and checkpoints ask of a model family.

    Shapes: B samples; latents (B, *latent_shape) float32 (images (B, C, h, w), videos (B, C, f, h, w)); σ is
    (B,) float32 in [0, 1] (σ = 1 noise, x_σ = (1−σ)·x0 + σ·ε, v = ε − x0; ``flowrl.types``). ``PolicyBase``
    implements the adapter and weight methods for the diffusers families; a new family implements the rest.
    """

    family: str                 # "sd3" | "flux" | "wan" | "qwen_image" | "qwen_image_edit" | "toy"
    accepts_images: bool        # encode(..., images=...) takes reference images (image-conditioned prompts)
    device: torch.device
    dtype: torch.dtype          # model compute dtype; samplers keep float32 latents
    default_guidance: float     # the family's CFG / distilled-guidance default (sampler.guidance: None → this)

    # ---- construction (classmethods) --------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path=None, dtype: torch.dtype = torch.bfloat16, device="cpu", config=None) -> Policy:
        """Load from a hub id or local directory (None → the family's default checkpoint)."""

    @classmethod
    def tiny(cls, seed: int = 0, config=None, device="cpu") -> Policy:
        """A tiny random instance built from config objects (tests, dry runs; no download)."""

    def save_pretrained(self, directory) -> Path:
        """Diffusers layout + adapters that ``from_pretrained(directory)`` restores exactly."""

    # ---- the model -----------------------------------------------------------------------------------------
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None,
               cfg: bool = True, images: Sequence | None = None) -> Cond:
        """Conditioning of B prompts (``Cond.embeds`` tensors with B rows). With ``cfg`` the unconditional /
        negative part ``Cond.uncond`` is filled too. ``images``: None, or B entries, each None or a list of
        reference images, float32 (3, H, W) in [0, 1]; a policy with ``accepts_images`` puts what it needs
        (e.g. encoded reference latents) into ``Cond.embeds``, batch-first; any other policy raises."""

    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """Per-sample latent shape for a pixel resolution, e.g. (C, H/8, W/8) or (C, F', H', W')."""

    def noise(self, generators: Sequence[torch.Generator], height: int, width: int,
              num_frames: int | None = None) -> Tensor:
        """Starting noise (B, *latent_shape) float32, row b drawn from ``generators[b]`` alone."""

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """The (num_steps + 1,) float32 σ grid the family's diffusers pipeline uses for these latents
        (shift, FLUX resolution-dependent shift), decreasing from ≤ 1 to 0."""

    def velocity(self, x: Tensor, sigma: Tensor, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) (B, ...) float32 for latents x (B, ...) and σ (B,) or a scalar, under the active adapter.
        CFG inside: ``v_u + w·(v_c − v_u)`` when w > 1 and ``cond.uncond`` is set (FLUX: the distilled guidance
        embedding); ``guidance=None`` → ``default_guidance`` if ``cond.uncond`` is set, else 1."""

    def decode(self, latents: Tensor) -> Tensor:
        """Pixels float32 in [0, 1]: images (B, 3, H, W) or videos (B, F, 3, H, W)."""

    # ---- weights: the "train" and "old" adapters (or full fine-tune) and the frozen base ---------------------------
    def adapter(self, name: str | None) -> AbstractContextManager:
        """Context in which ``velocity`` runs under adapter ``name`` ("train", "old") or the frozen base (None)."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters the optimizer updates (the "train" LoRA adapter, or every transformer weight)."""

    def copy_adapter(self, src: str = "train", dst: str = "old") -> None:
        """dst ← src."""

    def soft_update_adapter(self, decay: float, src: str = "train", dst: str = "old") -> None:
        """dst ← decay·dst + (1 − decay)·src."""

    def weight_sets(self) -> list[str]:
        """The named weight sets a checkpoint holds: "train", "old" and any extra LoRA adapter (e.g. "ref")."""

    def adapter_state_dict(self, name: str = "train") -> dict[str, Tensor]:
        """Adapter ``name``'s tensors (CPU-loadable), the checkpoint groups "train" / "old"."""

    def load_adapter_state_dict(self, state: dict[str, Tensor], name: str = "train") -> None:
        """Inverse of ``adapter_state_dict``."""

    def enable_gradient_checkpointing(self, enabled: bool = True) -> None:
        """Recompute transformer activations in backward."""

    # ---- sharding (FSDP, flowrl.distributed.fsdp) ------------------------------------------------------------
    def shard_units(self) -> list[tuple[nn.Module, list[nn.Module]]]:
        """(transformer, its blocks) for every transformer the policy holds: the trainable one (with its LoRA
        adapters) first, then any frozen copy ("old", the base in full fine-tune). Each block is one FSDP unit,
        the transformer's remaining layers another."""


# --------------------------------------------------------------------------------------------------
# Shared mechanics for the diffusers-backed policies (sd3, flux, wan). One level of inheritance;
# the weight switching itself is composed (``weights.TransformerWeights``).
# --------------------------------------------------------------------------------------------------


def cfg_combine(v_cond: Tensor, v_uncond: Tensor, scale: float) -> Tensor:
    """Classifier-free guidance  v = v_u + w·(v_c − v_u)  (Ho & Salimans 2022; every diffusers pipeline)."""
    return v_uncond + scale * (v_cond - v_uncond)


def sigma_batch(sigma: Tensor | float, batch: int, device: torch.device) -> Tensor:
    """σ as a (B,) float32 tensor on ``device`` (accepts a scalar, a 0-d or a (B,) tensor)."""
    s = torch.as_tensor(sigma, dtype=torch.float32, device=device)
    if s.dim() == 0:
        s = s.expand(batch)
    if s.shape != (batch,):
        raise ValueError(f"sigma must be a scalar or shaped ({batch},) for a batch of {batch}, got {tuple(s.shape)}")
    return s


def scheduler_sigmas(scheduler_config: dict, num_steps: int, mu: float | None = None,
                     sigmas: Sequence[float] | None = None) -> Tensor:
    """The (num_steps + 1,) σ grid diffusers' FlowMatchEulerDiscreteScheduler(**config).set_timesteps gives.

    Static shift σ ↦ sσ/(1 + (s − 1)σ) or, with ``use_dynamic_shifting``, e^μ/(e^μ + (1/σ − 1)) (SD3 paper
    §5.3.2; FLUX resolution-dependent shift); computed by the pure functions of ``samplers.schedule``.
    """
    from samplers.schedule import flow_match_sigmas

    unsupported = [k for k in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas")
                   if scheduler_config.get(k)]
    if unsupported:
        raise NotImplementedError(f"scheduler config sets {unsupported}; flowrl supports the plain/shifted flow-match "
                                  "grid only. Remove these keys from the scheduler config.")
    return flow_match_sigmas(
        num_steps, shift=scheduler_config.get("shift", 1.0),
        use_dynamic_shifting=bool(scheduler_config.get("use_dynamic_shifting", False)), mu=mu, sigmas=sigmas,
        num_train_timesteps=scheduler_config.get("num_train_timesteps", 1000),
        time_shift_type=scheduler_config.get("time_shift_type", "exponential"),
        shift_terminal=scheduler_config.get("shift_terminal"))


def resolve_guidance(guidance: float | None, default: float, cond: Cond) -> tuple[float, bool]:
    """(w, use_cfg). ``None`` means the family default when ``cond`` has an uncond part, else 1 (no CFG);
    an explicit w > 1 without an uncond part is an error."""
    if guidance is None:
        guidance = default if cond.uncond is not None else 1.0
    if guidance > 1.0 and cond.uncond is None:
        raise ValueError(f"guidance {guidance} > 1 needs the unconditional embeddings: encode the prompts with "
                         "cfg=True, or pass guidance=1.0")
    return float(guidance), guidance > 1.0


class PolicyBase:
    """Adapter switching, trainable parameters, noise and checkpointing shared by the diffusers policies.

    Subclasses set ``self.weights`` (a ``TransformerWeights``), ``self.device``, ``self.dtype`` and implement
    ``latent_shape``/``encode``/``sigmas``/``velocity``/``decode``.
    """

    family: str = ""
    default_guidance: float = 1.0
    accepts_images: bool = False       # image-conditioned prompts (``encode(images=...)``)
    requires_images: bool = False      # every prompt must carry one (editing); read by the start-up checks
    shard_blocks: tuple[str, ...] = ("transformer_blocks",)   # the transformer's block lists (FSDP units)
    default_path: str = ""             # hub id ``from_pretrained(None)`` loads
    index_entries: dict = {}           # model_index.json entries overriding the written ones (pipeline-module classes)

    @property
    def transformer(self) -> nn.Module:
        """The trainable transformer (with its LoRA adapters when in LoRA mode)."""
        return self.weights.transformer

    def adapter(self, name: str | None):
        """``with policy.adapter("old"):`` — velocity runs adapter "train" | "old" | None (frozen base)."""
        return self.weights.use(name)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.weights.trainable_parameters()

    def adapter_parameters(self, name: str = "train") -> list[nn.Parameter]:
        """Parameters of adapter ``name`` ("train" | "old"), in a fixed order shared by both."""
        return self.weights.parameters(name)

    def copy_adapter(self, src: str = "train", dst: str = "old") -> None:
        """dst ← src (e.g. old ← train at the start of an on-policy iteration)."""
        self.weights.copy(src, dst)

    def soft_update_adapter(self, decay: float, src: str = "train", dst: str = "old") -> None:
        """dst ← decay·dst + (1 − decay)·src."""
        self.weights.soft_update(decay, src, dst)

    def weight_sets(self) -> list[str]:
        return [n for n in self.weights.names() if n is not None]

    def adapter_state_dict(self, name: str = "train") -> dict[str, Tensor]:
        return self.weights.state_dict(name)

    def load_adapter_state_dict(self, state: dict[str, Tensor], name: str = "train") -> None:
        self.weights.load_state_dict(state, name)

    def save_adapter(self, path, name: str = "train") -> None:
        """Adapter ``name`` → safetensors file ``path``."""
        self.weights.save(path, name)

    def load_adapter(self, path, name: str = "train") -> None:
        """safetensors file ``path`` → adapter ``name`` (a "train" file may be loaded into "old" too)."""
        self.weights.load(path, name)

    def check_images(self, images: Sequence | None, batch: int) -> list[list[Tensor] | None] | None:
        """Validate ``encode``'s ``images``: None, or ``batch`` entries each None or a list of (3, H, W) float
        tensors in [0, 1]; one-line ValueError otherwise, or when this policy does not take images."""
        return check_images(images, batch, self.family, self.accepts_images)

    def use_wrapped_transformer(self, wrapped: nn.Module) -> None:
        """Route ``velocity`` through ``wrapped`` (what ``accelerator.prepare(policy.transformer)`` returned:
        DDP / FSDP) so gradients synchronise; adapter switching still acts on the same underlying modules."""
        self.weights.forward_module = wrapped

    def shard_units(self) -> list[tuple[nn.Module, list[nn.Module]]]:
        """(transformer, its blocks) for every transformer of ``self.weights`` (``Policy.shard_units``); the
        blocks are the modules of the family's ``shard_blocks`` lists."""
        return [(m, [block for attr in self.shard_blocks for block in getattr(m, attr)])
                for m in self.weights.modules()]

    def enable_gradient_checkpointing(self, enabled: bool = True) -> None:
        """Recompute transformer activations in backward (diffusers' per-block checkpointing)."""
        if enabled:
            self.transformer.enable_gradient_checkpointing()
        else:
            self.transformer.disable_gradient_checkpointing()

    def noise(self, generators: Sequence[torch.Generator], height: int, width: int,
              num_frames: int | None = None) -> Tensor:
        """Starting noise (B, *latent_shape) float32; row b ~ N(0, I) from ``generators[b]`` alone.

        Drawn on each generator's device and moved, exactly like diffusers' ``randn_tensor`` with a list.
        """
        if len(generators) == 0:
            raise ValueError("noise() needs one torch.Generator per sample; got an empty list")
        shape = (1, *self.latent_shape(height, width, num_frames))
        rows = [torch.randn(shape, generator=g, device=g.device, dtype=torch.float32) for g in generators]
        return torch.cat(rows).to(self.device)

    def _transformer_module(self) -> nn.Module:
        return self.weights.module()

    # ---- construction helpers shared by the diffusers families ---------------------------------------
    transformer_components: tuple[str, ...] = ("transformer",)   # components cast to the compute dtype

    def _make_weights(self, components: dict, config):
        """The weight sets ``velocity`` switches between (one transformer: ``TransformerWeights``)."""
        from flowrl.policies.weights import TransformerWeights

        return TransformerWeights(components["transformer"], config.lora, config.keep_base)

    def _setup(self, components: dict, config, device, dtype) -> None:
        """Place components, wrap the transformer's weights (LoRA / full-FT), keep VAE and scheduler config."""
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype or components["transformer"].dtype
        self.default_guidance = config.guidance
        for c in components.values():
            if isinstance(c, nn.Module):
                c.to(self.device).eval().requires_grad_(False)
        for name in self.transformer_components:
            if components[name].dtype != self.dtype:
                components[name].to(self.dtype)
        self.vae = components["vae"]
        self.scheduler_config = dict(components["scheduler"].config)
        self.weights = self._make_weights(components, config)
        if config.gradient_checkpointing:
            self.enable_gradient_checkpointing()

    def save_pretrained(self, directory):
        """Diffusers pipeline layout (base transformer, no LoRA tensors) + ``adapters/<name>.safetensors``
        ("train" and "old" with LoRA; the trained weights are the saved transformer in full fine-tune, plus
        "old") + ``flowrl_policy.json``. ``from_pretrained(directory)`` restores all of it."""
        from dataclasses import asdict

        from flowrl.policies import components as comp

        parts = {k: v for k, v in self.pipe.components.items() if v is not None and k in self.spec}
        out = comp.save_components(directory, self.pipeline_class, parts, self.weights.base_state_dict(),
                                   extra_index=self.index_entries)
        comp.write_policy_config(out, {"family": self.family, "config": asdict(self.config)})
        for name in self._saved_weight_names():
            self.weights.save(comp.adapter_path(out, name), name)
        return out

    @classmethod
    def from_pretrained(cls, path: str | None = None, dtype: torch.dtype = torch.bfloat16, device="cpu", config=None):
        """``components.load_policy``: ``cls.spec`` from ``path`` (None → ``cls.default_path``) + saved adapters."""
        from flowrl.policies.components import load_policy

        return load_policy(cls, path or cls.default_path, dtype, device, config)

    @classmethod
    def _pipeline_kwargs(cls, path) -> dict:
        return {}

    @classmethod
    def _saved_config(cls, path):
        """The policy Config stored by ``save_pretrained`` in ``path`` (None for hub ids / plain pipelines)."""
        from flowrl.policies import components as comp

        saved = comp.read_policy_config(path)
        if saved is None:
            return None
        if saved.get("family") != cls.family:
            raise ValueError(f"{path} holds a {saved.get('family')!r} policy, not {cls.family!r}; "
                             f"load it with the {saved.get('family')!r} policy class")
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["config"].items()}   # json lists
        if fields.get("lora") is not None:
            from flowrl.policies.lora import LoraConfig

            lc = dict(fields["lora"])
            fields["lora"] = LoraConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in lc.items()})
        return cls.config_class(**fields)

    def _saved_weight_names(self) -> list[str]:
        return self.weight_sets() if self.weights.is_lora else ["old"]

    def _load_saved_adapters(self, path) -> None:
        from flowrl.policies import components as comp

        if not comp.is_local(path):
            return
        for name in self._saved_weight_names():
            file = comp.adapter_path(path, name)
            if file.is_file():
                self.weights.load(file, name)

    # ---- resolution, checked from the config before any weights load ------------------------------------
    spatial_multiple: int = 16         # H, W multiples of the default checkpoint: VAE factor × patch size
    tiny_spatial_multiple: int = 1     # the same for the ``tiny`` preset

    @classmethod
    def check_resolution(cls, height: int, width: int, num_frames: int | None = None, *, tiny: bool = False,
                         path=None) -> None:
        """One-line ValueError naming ``height`` / ``width`` / ``num_frames`` unless this family can generate
        that size: H and W multiples of VAE factor × patch size (of the tiny preset, of a local checkpoint's
        config files at ``path``, else of the family's default checkpoint). No weights are loaded."""
        mult = cls.tiny_spatial_multiple if tiny else cls._local_spatial_multiple(path) or cls.spatial_multiple
        for key, value in (("height", height), ("width", width)):
            if value < 1 or value % mult:
                raise ValueError(f"{key} must be a positive multiple of {mult} for {cls.family} (VAE factor × "
                                 f"patch size), got {value}")
        cls.check_frames(num_frames)

    temporal_factor: int | None = None   # video families: num_frames − 1 must be a multiple of it
    frames_example: int = 121

    @classmethod
    def check_frames(cls, num_frames: int | None) -> None:
        """Image families: no frame count (or 1). Video families (``temporal_factor`` set): F frames with F − 1
        divisible by the temporal factor."""
        if cls.temporal_factor is not None:
            if num_frames is None or num_frames < 1 or (num_frames - 1) % cls.temporal_factor:
                raise ValueError(f"num_frames: {cls.family} makes videos of F frames with F − 1 divisible by "
                                 f"{cls.temporal_factor} (e.g. {cls.frames_example}), got {num_frames}")
            return
        if num_frames not in (None, 1):
            raise ValueError(f"num_frames: {cls.family} makes images, got num_frames={num_frames} (use null)")

    @classmethod
    def _local_spatial_multiple(cls, path) -> int | None:
        """VAE factor × patch size read from a local diffusers checkpoint's ``vae`` and ``transformer``
        config.json files; None when ``path`` is not such a directory."""
        import json

        if path is None or not Path(path).expanduser().is_dir():
            return None
        parts = [Path(path).expanduser() / sub / "config.json" for sub in ("vae", "transformer")]
        if not all(p.is_file() for p in parts):
            return None
        vae, transformer = (json.loads(p.read_text()) for p in parts)
        return cls._spatial_multiple_from(vae, transformer)

    @classmethod
    def _spatial_multiple_from(cls, vae: dict, transformer: dict) -> int:
        """SD3-style: 2^(len(block_out_channels) − 1) · patch_size (diffusers' ``vae_scale_factor``)."""
        return 2 ** (len(vae["block_out_channels"]) - 1) * int(transformer.get("patch_size", 1))
