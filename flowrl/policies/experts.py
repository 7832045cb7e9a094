"""Weight sets of a mixture-of-experts policy: several transformers (Wan2.2-A14B's ``transformer`` and
``transformer_2``) behind one "train" / "old" / base (None) interface.

Each *trained* expert carries its own ``TransformerWeights`` (LoRA named adapters, or full fine-tune copies);
an expert left out of training is one frozen module, so under every weight set it runs its base weights (its
"old" and its base are the same thing). Switching, copying, soft updates and state dicts act on every trained
expert at once; state-dict keys are prefixed with the expert's component name (``transformer.`` /
``transformer_2.``), so one checkpoint group holds both experts. Only one expert runs per step (the boundary picks
it, ``pipeline_wan.py``), so an expert can get no gradient in a step: its parameters simply have ``grad is None``.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from flowrl.policies import lora
from flowrl.policies.lora import TRAIN, LoraConfig
from flowrl.policies.weights import TransformerWeights


class ExpertWeights:
    """Named weight sets over ``experts`` (component name → transformer), trained ones listed in ``trained``."""

    def __init__(self, experts: dict[str, nn.Module], trained: tuple[str, ...], lora_config: LoraConfig | None,
                 keep_base: bool = True):
        unknown = [e for e in trained if e not in experts]
        if not trained or unknown:
            raise ValueError(f"train_experts must name one or more of {list(experts)}, got {list(trained)}")
        self.lora_config = lora_config
        self.experts = dict(experts)
        self.trained = {e: TransformerWeights(experts[e], lora_config, keep_base) for e in experts if e in trained}
        for e, m in self.experts.items():
            if e not in self.trained:
                m.requires_grad_(False).eval()

    @property
    def is_lora(self) -> bool:
        return self.lora_config is not None

    @property
    def transformer(self) -> nn.Module:
        """The first trained expert (``Policy.transformer``)."""
        return next(iter(self.trained.values())).transformer

    @property
    def forward_module(self) -> nn.Module:
        return next(iter(self.trained.values())).forward_module

    @forward_module.setter
    def forward_module(self, module: nn.Module) -> None:
        next(iter(self.trained.values())).forward_module = module

    def names(self) -> list[str | None]:
        return next(iter(self.trained.values())).names()

    def modules(self) -> list[nn.Module]:
        """Every transformer holding a weight set: trained experts (then their frozen copies), then frozen experts."""
        out = [m for w in self.trained.values() for m in w.modules()]
        return out + [m for e, m in self.experts.items() if e not in self.trained]

    def module(self, expert: str = "transformer") -> nn.Module:
        """The module ``expert`` runs for the active weight set."""
        w = self.trained.get(expert)
        return w.module() if w is not None else self.experts[expert]

    @contextmanager
    def use(self, name: str | None) -> Iterator[None]:
        with ExitStack() as stack:
            for w in self.trained.values():
                stack.enter_context(w.use(name))
            yield

    def named_parameters(self, name: str | None) -> dict[str, nn.Parameter]:
        return {f"{e}.{k}": p for e, w in self.trained.items() for k, p in w.named_parameters(name).items()}

    def parameters(self, name: str | None) -> list[nn.Parameter]:
        return list(self.named_parameters(name).values())

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.parameters(TRAIN)

    def copy(self, src: str = TRAIN, dst: str = "old") -> None:
        for w in self.trained.values():
            w.copy(src, dst)

    def soft_update(self, decay: float, src: str = TRAIN, dst: str = "old") -> None:
        for w in self.trained.values():
            w.soft_update(decay, src, dst)

    def state_dict(self, name: str = TRAIN) -> dict[str, Tensor]:
        return {k: p.detach().clone() for k, p in self.named_parameters(name).items()}

    def _split(self, state: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
        parts: dict[str, dict[str, Tensor]] = {e: {} for e in self.trained}
        for k, v in state.items():
            e, _, rest = k.partition(".")
            if e not in parts:
                raise KeyError(f"state key {k!r} names no trained expert (trained: {list(self.trained)})")
            parts[e][rest] = v
        return parts

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Tensor], name: str = TRAIN) -> None:
        for e, part in self._split(state).items():
            self.trained[e].load_state_dict(part, name)

    def save(self, path: str | Path, name: str = TRAIN) -> None:
        meta = {"mode": "lora" if self.is_lora else "full", "name": name, "experts": list(self.trained)}
        lora.save_state(path, self.state_dict(name), meta)

    def load(self, path: str | Path, name: str = TRAIN) -> None:
        self.load_state_dict(lora.load_state(path), name)

    def base_state_dicts(self) -> dict[str, dict[str, Tensor]]:
        """Each expert's weights without adapters (LoRA) or as trained (full fine-tune), by component name."""
        return {e: (self.trained[e].base_state_dict() if e in self.trained else m.state_dict())
                for e, m in self.experts.items()}
