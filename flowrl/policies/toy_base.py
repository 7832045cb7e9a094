"""What the two shapes-world toy policies share: a word-level tokenizer, a small text encoder and a transformer in
pixel space (no VAE), built, loaded and saved through the real diffusers / transformers classes.

A subclass sets ``modules`` (its ``*_modules`` file: ``build_modules``, ``load_modules``, ``default_asset_dir``)
and implements the Policy members that differ (``encode``, latent shape, decode, resolution checks).
"""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from flowrl.policies.base import PolicyBase


class ToyPolicyBase(PolicyBase):
    """Construction, ``from_pretrained`` / ``tiny`` / ``save_pretrained`` of a toy policy (module doc)."""

    modules: ModuleType            # the subclass' toy_modules / toy_video_modules

    def __init__(self, tokenizer, text_encoder, transformer, config=None,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        from diffusers import FlowMatchEulerDiscreteScheduler

        config = config or self.config_class()
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=config.shift)
        parts = {"transformer": transformer, "text_encoder": text_encoder, "vae": None, "scheduler": scheduler}
        self._setup(parts, config, device, dtype)
        self.tokenizer, self.text_encoder = tokenizer, text_encoder.to(self.device, self.dtype)

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu", config=None):
        """Load ``path`` (default: the package's checkpoint, ``modules.default_asset_dir()``) through the real
        diffusers / transformers ``from_pretrained``; a ``save_pretrained`` directory restores its adapters."""
        path = Path(path) if path is not None else cls.modules.default_asset_dir()
        config = config or cls._saved_config(path)
        tok, te, tr = cls.modules.load_modules(path, device, dtype)
        policy = cls(tok, te, tr, config, device, dtype)
        policy._load_saved_adapters(path)
        return policy

    @classmethod
    def tiny(cls, seed: int = 0, config=None, device: torch.device | str = "cpu"):
        """A randomly initialised few-thousand-parameter policy (float32) for tests."""
        tok, te, tr = cls.modules.build_modules("tiny", seed)
        return cls(tok, te, tr, config, device, torch.float32)

    def save_pretrained(self, directory: str | Path) -> Path:
        """tokenizer.json, text_encoder/, transformer/ (base weights, no LoRA tensors), adapters/<name>.safetensors
        and flowrl_policy.json; ``from_pretrained(directory)`` restores all of it."""
        from dataclasses import asdict

        from flowrl.policies import components as comp

        out = comp.save_components(directory, type(self).__name__, {"transformer": self.transformer,
                                                                    "text_encoder": self.text_encoder},
                                   self.weights.base_state_dict())
        self.tokenizer.save(str(Path(out) / "tokenizer.json"))
        comp.write_policy_config(out, {"family": self.family, "config": asdict(self.config)})
        for name in self._saved_weight_names():
            self.weights.save(comp.adapter_path(out, name), name)
        return Path(out)
