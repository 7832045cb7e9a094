"""The reward contract: a callable on a ``RewardInput`` batch returning scores, plus input/output checks.

A reward is any callable ``reward(batch: RewardInput) -> Tensor[B] | dict[str, Tensor[B]]``.  A dict holds
``"score"`` (the reward) and optional named sub-scores (``{"score": s, "count": c}``).  NaN means "does not
apply to this sample" (e.g. OCR on a prompt without quoted text) and is excluded downstream (as trl's reward_funcs'
None and MARBLE's NaN masks). ±inf is passed through as a failure on that sample: the trainer treats it like
NaN (the sample is left out unless another reward applies) and counts and names it (docs/training.md
"Faults"); one bad sample does not stop a run.  Rewards with weights load them lazily in
``setup(device, dtype)`` so that ``import rewards`` stays cheap.  Optional class attributes:

    name:         str              shown in errors and logs (defaults to the registry name)
    accepts:      tuple[str, ...]  ("image",), ("video",) or both (the default): checked before the call
    shapes_world: bool             its images are shapes-world scenes, so the loop also logs the palette
                                   detectors (``flowrl.eval.detectors``) of the batches it scores (default False)
    Config:       a dataclass      ``RewardSpec.kwargs`` are turned into ``Config(**kwargs)`` for the constructor

Two Protocols: ``Reward`` is what a plugin must be (the optional attributes above are read once, by
``rewards.build.BoundReward``); ``LoadedReward`` is what the loop sees of every reward of a ``RewardSet``: the
plugin wrapped with its device and batching, every optional attribute filled in (``flowrl.contracts``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from flowrl.types import RewardInput

__all__ = ["LoadedReward", "OPTIONAL_ATTRIBUTES", "Reward", "RewardError", "RewardInput", "check_input", "make_input",
           "nanmean", "normalize_output"]

_RANGE_TOL = 1e-3


class RewardError(ValueError):
    """A reward got bad input, failed, or returned something that breaks the contract; names the reward."""


@runtime_checkable
class Reward(Protocol):
    """What a reward plugin must be: a callable on a batch (a function, or a class / instance with the optional
    attributes of the module docstring and ``setup``)."""

    def __call__(self, batch: RewardInput) -> Tensor | dict[str, Tensor]: ...


OPTIONAL_ATTRIBUTES = {"name": str, "accepts": tuple, "shapes_world": bool}   # with their types, when declared


@runtime_checkable
class LoadedReward(Protocol):
    """A reward as the loop holds it (``rewards.build.BoundReward``): every optional part resolved."""

    name: str
    accepts: tuple[str, ...]
    shapes_world: bool

    def setup(self) -> None:
        """Load the reward's weights on its device (once; otherwise on first use)."""

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        """``{"score": (B,), <aspect>: (B,)}`` float32 CPU tensors."""


def make_input(pixels: Tensor, prompts: list[str] | None = None, group_ids: Tensor | None = None,
               meta: list[dict] | None = None) -> RewardInput:
    """Build a ``RewardInput`` with default prompts (""), group ids (0..B-1) and metadata ({})."""
    n = pixels.shape[0]
    prompts = [""] * n if prompts is None else list(prompts)
    group_ids = torch.arange(n) if group_ids is None else torch.as_tensor(group_ids, dtype=torch.long)
    return RewardInput(pixels=pixels, prompts=prompts, group_ids=group_ids,
                       meta=[{} for _ in range(n)] if meta is None else list(meta))


def check_input(batch: RewardInput, name: str, accepts: tuple[str, ...] = ("image", "video")) -> None:
    """Raise ``RewardError`` naming reward ``name`` unless ``batch`` is a valid image/video batch in [0, 1]."""
    px = batch.pixels
    if not isinstance(px, Tensor):
        raise RewardError(f"reward {name!r}: pixels must be a torch.Tensor, got {type(px).__name__}")
    if px.dim() not in (4, 5) or px.shape[-3] != 3:
        raise RewardError(f"reward {name!r}: pixels must be (B, 3, H, W) images or (B, F, 3, H, W) videos, "
                          f"got shape {tuple(px.shape)}; decode latents and put channels before H, W")
    kind = "video" if px.dim() == 5 else "image"
    if kind not in accepts:
        fix = " (wrap it: video_frame_mean with reward=...)" if kind == "video" else ""
        raise RewardError(f"reward {name!r} accepts {'/'.join(accepts)} batches, got a {kind} batch "
                          f"of shape {tuple(px.shape)}{fix}")
    if not px.is_floating_point():
        raise RewardError(f"reward {name!r}: pixels must be float in [0, 1], got dtype {px.dtype}; "
                          "convert uint8 with x.float() / 255")
    if px.numel():
        lo, hi = float(px.detach().min()), float(px.detach().max())
        if not (lo >= -_RANGE_TOL and hi <= 1 + _RANGE_TOL):
            raise RewardError(f"reward {name!r}: pixels must lie in [0, 1], got range [{lo:.3g}, {hi:.3g}]; "
                              "map [-1, 1] outputs with (x + 1) / 2 and clamp")
    n = px.shape[0]
    if len(batch.prompts) != n:
        raise RewardError(f"reward {name!r}: {n} samples but {len(batch.prompts)} prompts")
    if batch.group_ids.shape != (n,):
        raise RewardError(f"reward {name!r}: group_ids must have shape ({n},), got {tuple(batch.group_ids.shape)}")
    if batch.meta and len(batch.meta) != n:
        raise RewardError(f"reward {name!r}: {n} samples but {len(batch.meta)} metadata dicts")


def _as_vector(value: Any, n: int, name: str, key: str) -> Tensor:
    try:
        t = torch.as_tensor(value.detach() if isinstance(value, Tensor) else value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise RewardError(f"reward {name!r}: output {key!r} is not a tensor of numbers ({e})") from e
    t = t.to(device="cpu", dtype=torch.float32)
    if t.dim() == 2 and t.shape[1] == 1:
        t = t[:, 0]
    if t.shape != (n,):
        raise RewardError(f"reward {name!r}: output {key!r} must have shape ({n},) for a batch of {n}, "
                          f"got {tuple(t.shape)}")
    return t


def normalize_output(out: Any, n: int, name: str) -> dict[str, Tensor]:
    """Turn a reward's return value into ``{"score": (n,), <aspect>: (n,)}`` float32 CPU tensors, or raise.

    Accepts a (n,) tensor / list / array, or a mapping with a ``"score"`` key and optional sub-scores.
    """
    if isinstance(out, Mapping):
        if "score" not in out:
            raise RewardError(f"reward {name!r}: a dict output needs a 'score' key, got keys {sorted(out)}")
        return {str(k): _as_vector(v, n, name, str(k)) for k, v in out.items()}
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
        raise RewardError(f"reward {name!r}: returned a (scores, info) tuple (Flow-GRPO style); "
                          "return scores or {'score': scores, ...} instead")
    return {"score": _as_vector(out, n, name, "score")}


def nanmean(x: Tensor, dim: int) -> Tensor:
    """Mean over ``dim`` ignoring NaN; NaN where every entry is NaN."""
    valid = ~torch.isnan(x)
    total = torch.where(valid, x, torch.zeros_like(x)).sum(dim)
    count = valid.sum(dim)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, math.nan))
