"""Which transformer weights a policy's ``velocity`` runs: "train", "old" or the frozen base (None).

Two modes behind one interface (composed into every policy):

* LoRA (default): peft named adapters on the one transformer (``lora.py``); switching never copies. Besides
  "train" and "old", ``LoraConfig.names`` may list more (e.g. "ref"); each starts equal to "train".
* Full fine-tune (``lora=None``): every transformer parameter trains; "old" and the base are frozen
  deep copies of the transformer made at construction. Memory cost: one extra copy of the transformer
  weights for "old" and one for the base (``keep_base=False`` drops the base copy, e.g. when no KL to the
  reference is used; ``adapter(None)`` then raises). Anchors offer no base reference in full-FT mode
  (flow_grpo ``train_sd3.py``: KL via ``disable_adapter()``, LoRA only); the copies make both modes behave the same.
"""
from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from flowrl.policies import lora
from flowrl.policies.lora import OLD, TRAIN, LoraConfig


class TransformerWeights:
    """Named weight sets ("train", "old", None=base) of one transformer, switchable in a context."""

    def __init__(self, transformer: nn.Module, lora_config: LoraConfig | None, keep_base: bool = True):
        self.transformer = transformer
        self.lora_config = lora_config
        self.active: str | None = TRAIN
        self.forward_module: nn.Module = transformer     # a DDP/FSDP wrapper of it, once set by the trainer
        self._copies: dict[str | None, nn.Module] = {}
        if lora_config is not None:
            if TRAIN not in lora_config.names[:1] or OLD not in lora_config.names:
                raise ValueError(f"LoraConfig.names must start with {TRAIN!r} and contain {OLD!r}, "
                                 f"got {lora_config.names}")
            lora.add_adapters(transformer, lora_config)
            self._tuner_layers = lora.tuner_layers(transformer)   # fixed from here on: sharding keeps modules
        else:
            transformer.requires_grad_(True)
            self._copies[OLD] = _frozen_copy(transformer)
            if keep_base:
                self._copies[None] = _frozen_copy(transformer)

    @property
    def is_lora(self) -> bool:
        return self.lora_config is not None

    def names(self) -> list[str | None]:
        """The weight sets this policy can switch to: with LoRA every adapter of ``LoraConfig.names`` (e.g. a
        third, "ref", a refreshable reference for GARDO) and the base."""
        return [*self.lora_config.names, None] if self.is_lora else [TRAIN, *self._copies]

    def modules(self) -> list[nn.Module]:
        """Every transformer that holds a weight set: the trainable one (with its LoRA adapters) first, then the
        frozen full fine-tune copies ("old", the base)."""
        return [self.transformer, *self._copies.values()]

    def module(self) -> nn.Module:
        """The module to call for the active weight set."""
        if self.is_lora or self.active == TRAIN:
            return self.forward_module
        return self._copies[self.active]

    def _activate(self, name: str | None) -> None:
        if name not in self.names():
            hint = " (full fine-tune made without keep_base=True)" if name is None else ""
            raise KeyError(f"unknown adapter {name!r}{hint}; choose one of {self.names()}")
        if self.is_lora:
            lora.activate(self.transformer, name, trainable=TRAIN, layers=self._tuner_layers)
        self.active = name

    @contextmanager
    def use(self, name: str | None) -> Iterator[None]:
        """Within the block the transformer runs weight set ``name``; restores the previous one after. Asking for
        the active set (always a known one) switches nothing: with LoRA a switch visits every adapter layer
        (docs/BENCHMARKS.md "adapters")."""
        previous = self.active
        if name == previous:
            yield
            return
        self._activate(name)
        try:
            yield
        finally:
            self._activate(previous)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The "train" adapter's parameters (LoRA) or all transformer parameters (full fine-tune)."""
        return self.parameters(TRAIN)

    def named_parameters(self, name: str | None) -> dict[str, nn.Parameter]:
        """Parameters of weight set ``name`` keyed portably (same keys for "train" and "old")."""
        if self.is_lora:
            if name is None:
                raise KeyError("the base (None) has no adapter parameters; it is the frozen transformer itself")
            return lora.adapter_named_parameters(self.transformer, name)
        if name not in self.names():
            raise KeyError(f"unknown weight set {name!r}; choose one of {self.names()}")
        module = self.transformer if name == TRAIN else self._copies[name]
        return dict(module.named_parameters())

    def parameters(self, name: str | None) -> list[nn.Parameter]:
        return list(self.named_parameters(name).values())

    @torch.no_grad()
    def copy(self, src: str = TRAIN, dst: str = OLD) -> None:
        """dst ← src."""
        for d, s in zip(self.parameters(dst), self.parameters(src), strict=True):
            d.copy_(s)

    def soft_update(self, decay: float, src: str = TRAIN, dst: str = OLD) -> None:
        """dst ← decay·dst + (1 − decay)·src."""
        lora.soft_update(self.parameters(dst), self.parameters(src), decay)

    def state_dict(self, name: str = TRAIN) -> dict[str, Tensor]:
        """Detached copies of weight set ``name`` (portable keys)."""
        return {k: p.detach().clone() for k, p in self.named_parameters(name).items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Tensor], name: str = TRAIN) -> None:
        """Copy ``state`` into weight set ``name``; keys and shapes must match."""
        if self.is_lora:
            return lora.load_adapter_state_dict(self.transformer, name, state)
        params = self.named_parameters(name)
        if set(params) != set(state):
            diff = sorted(set(params) ^ set(state))[:5]
            raise KeyError(f"state for {name!r} does not match the transformer (first differing keys: {diff})")
        for k, p in params.items():
            p.copy_(state[k])

    def save(self, path: str | Path, name: str = TRAIN) -> None:
        """Write weight set ``name`` as safetensors."""
        meta = {"mode": "lora" if self.is_lora else "full", "name": name}
        if self.is_lora:
            from dataclasses import asdict

            meta["lora"] = asdict(self.lora_config)
        lora.save_state(path, self.state_dict(name), meta)

    def load(self, path: str | Path, name: str = TRAIN) -> None:
        """Read a file written by ``save`` into weight set ``name``."""
        self.load_state_dict(lora.load_state(path), name)

    def base_state_dict(self) -> dict[str, Tensor]:
        """The transformer's weights without adapters (LoRA) or the trained weights (full fine-tune)."""
        return lora.base_state_dict(self.transformer) if self.is_lora else self.transformer.state_dict()


def _frozen_copy(module: nn.Module) -> nn.Module:
    twin = copy.deepcopy(module)
    twin.requires_grad_(False)
    twin.eval()
    return twin
