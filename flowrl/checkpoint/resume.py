"""Save and restore the whole state of an RL run, for exact resume (reference E §3.6).

A checkpoint (``flowrl.checkpoint.store``, atomic) holds tensor groups ``train`` and ``old`` (the LoRA adapters,
or the full transformer weights), ``ema`` (the eval-EMA shadow), and a state dict with the optimizer, the loop
counters (iteration = data position, optimizer steps, rollout NFEs, skip counts), the balancer state (MARBLE's
α-EMA), the objective's state (its ``end_iteration`` hook), the window position (MixGRPO) and every RNG.
Every rollout's noise and every training draw come from generators derived from (seed, iteration, ...), so
after ``load_run`` the run continues bitwise identically on CPU (``tests/trainer/test_resume.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.checkpoint.store import (
    capture_rng_state,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)


@dataclass
class RunState:
    """The objects whose state a checkpoint holds."""

    policy: Any
    optimizer: Any
    ema: Any
    balancer_state: dict
    objective_state: dict
    window: Any
    loop: Any                          # flowrl.training.state.LoopState


def save_run(run_dir: Path, s: RunState, keep: int, dist) -> None:
    """Write a checkpoint of the current iteration (main process), then wait for every process."""
    if dist.is_main:
        tensors = {"train": s.policy.adapter_state_dict("train"), "old": s.policy.adapter_state_dict("old")}
        extra = {"optimizer": s.optimizer.state_dict(), "loop": s.loop.as_dict(),
                 "balancer": dict(s.balancer_state), "objective": dict(s.objective_state),
                 "window": s.window.state_dict(), "rng": capture_rng_state()}
        if s.ema is not None:
            ema = s.ema.state_dict()
            tensors["ema"] = {f"{i:05d}": t for i, t in enumerate(ema.pop("shadow"))}
            extra["ema"] = ema
        save_checkpoint(run_dir, s.loop.iteration, tensors, extra, keep_last=keep)
    dist.barrier()


def load_run(run_dir: Path, s: RunState, dist) -> bool:
    """Restore the latest checkpoint of ``run_dir`` into ``s``; False (fresh start) when there is none."""
    path = latest_checkpoint(run_dir)
    if path is None:
        dist.print(f"[flowrl] run.resume: no checkpoint in {run_dir}; starting from scratch")
        return False
    tensors, extra = load_checkpoint(path, map_location="cpu")
    s.policy.load_adapter_state_dict(tensors["train"], "train")
    s.policy.load_adapter_state_dict(tensors["old"], "old")
    s.optimizer.load_state_dict(extra["optimizer"])
    if s.ema is not None:
        shadow = [tensors["ema"][k] for k in sorted(tensors["ema"])]
        s.ema.load_state_dict({**extra["ema"], "shadow": shadow})
    s.balancer_state.clear()
    s.balancer_state.update(extra["balancer"])
    s.objective_state.clear()
    s.objective_state.update(extra.get("objective", {}))
    s.window.load_state_dict(extra["window"])
    for key, value in extra["loop"].items():
        setattr(s.loop, key, value)
    restore_rng_state(extra["rng"])
    dist.print(f"[flowrl] resumed from {path} at iteration {s.loop.iteration}")
    return True
