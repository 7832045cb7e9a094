"""Evaluate trainer checkpoints: swap a checkpoint's weights into a policy's "train" weight set for a block.

A trainer checkpoint (``flowrl.checkpoint.resume.save_run`` through ``flowrl.checkpoint``) holds tensor groups
``train`` and ``old`` (adapter or full-transformer state dicts, ``policy.adapter_state_dict`` keys) and ``ema``
(the eval-EMA shadow of ``policy.trainable_parameters()``, keys ``00000, 00001, …`` in parameter order).
``checkpoint_weights`` loads one of them into the "train" weights, runs the block under
``policy.adapter("train")`` and puts the previous weights back afterwards, so several checkpoints can be
evaluated one after another on one model.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from flowrl.checkpoint import (
    CHECKPOINTS_DIR,
    CheckpointError,
    load_checkpoint,
    read_manifest,
    resolve_checkpoint,
)

WEIGHT_GROUPS = ("train", "old", "ema")


def run_dir_of(checkpoint: str | Path) -> Path:
    """The run directory a checkpoint belongs to (``<run>/checkpoints/step_N`` → ``<run>``)."""
    path = resolve_checkpoint(checkpoint)
    if path.parent.name != CHECKPOINTS_DIR:
        raise CheckpointError(f"{str(path)!r} is not inside a run's {CHECKPOINTS_DIR}/ directory")
    return path.parent.parent


def checkpoint_label(checkpoint: str | Path) -> str:
    """A column label for a checkpoint: ``step_<N>`` (its step number)."""
    return f"step_{read_manifest(resolve_checkpoint(checkpoint))['step']}"


@torch.no_grad()
def _load_group(policy, tensors: dict, group: str, path: Path) -> None:
    if group not in tensors:
        raise CheckpointError(f"checkpoint {str(path)!r} has no {group!r} weights (it has {sorted(tensors)}); "
                              f"choose one of them with --weights")
    if group != "ema":
        policy.load_adapter_state_dict(tensors[group], "train")
        return
    shadow = [tensors["ema"][k] for k in sorted(tensors["ema"])]
    params = list(policy.trainable_parameters())
    if len(shadow) != len(params):
        raise CheckpointError(f"checkpoint {str(path)!r}: EMA holds {len(shadow)} tensors but the policy has "
                              f"{len(params)} trainable parameters; was it trained with the same LoRA config?")
    for p, s in zip(params, shadow):
        if p.shape != s.shape:
            raise CheckpointError(f"checkpoint {str(path)!r}: EMA tensor {tuple(s.shape)} != parameter "
                                  f"{tuple(p.shape)}")
        p.copy_(s.to(p.device, p.dtype))


@contextmanager
def checkpoint_weights(policy, checkpoint: str | Path, group: str = "train") -> Iterator[None]:
    """Within the block ``policy.velocity`` runs checkpoint ``group`` ("train", "old" or "ema") as its
    "train" weights; the previous "train" weights are restored on exit."""
    if group not in WEIGHT_GROUPS:
        raise ValueError(f"weights group {group!r}: choose one of {WEIGHT_GROUPS}")
    path = resolve_checkpoint(checkpoint)
    tensors, _ = load_checkpoint(path, map_location="cpu")
    saved = policy.adapter_state_dict("train")
    try:
        _load_group(policy, tensors, group, path)
        with policy.adapter("train"):
            yield
    finally:
        policy.load_adapter_state_dict(saved, "train")
