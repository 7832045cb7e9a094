"""Save and restore the whole state of an RL run, for exact resume (reference E §3.6).

A checkpoint (``flowrl.checkpoint``, atomic) holds tensor groups ``train`` and ``old`` (the LoRA adapters, or
the full transformer weights), ``ema`` (the eval-EMA shadow), and a state dict with the optimizer, the loop
counters (iteration = data position, optimizer steps, rollout NFEs, skip counts), the balancer state (MARBLE's
α-EMA), the window position (MixGRPO) and every RNG. Every rollout's noise and every training draw come from
generators derived from (seed, iteration, ...), so after ``load_run`` the run continues bitwise identically on
CPU (``tests/trainer/test_resume.py``).
"""
from __future__ import annotations

from flowrl.checkpoint import (
    capture_rng_state,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)


def save_run(trainer) -> None:
    """Write a checkpoint of the current iteration (main process), then wait for every process."""
    parts, policy, state = trainer.parts, trainer.policy, trainer.state
    if trainer.dist.is_main:
        tensors = {"train": policy.adapter_state_dict("train"), "old": policy.adapter_state_dict("old")}
        extra = {"optimizer": parts.optimizer.state_dict(), "loop": state.as_dict(),
                 "balancer": dict(parts.balancer_state), "window": parts.window.state_dict(),
                 "rng": capture_rng_state()}
        if parts.ema is not None:
            ema = parts.ema.state_dict()
            tensors["ema"] = {f"{i:05d}": t for i, t in enumerate(ema.pop("shadow"))}
            extra["ema"] = ema
        save_checkpoint(trainer.cfg.run_dir, state.iteration, tensors, extra, keep_last=trainer.cfg.checkpoint.keep)
    trainer.dist.barrier()


def load_run(trainer) -> bool:
    """Restore the latest checkpoint of the run dir into ``trainer``; False (fresh start) when there is none."""
    path = latest_checkpoint(trainer.cfg.run_dir)
    if path is None:
        trainer.dist.print(f"[flowrl] run.resume: no checkpoint in {trainer.cfg.run_dir}; starting from scratch")
        return False
    tensors, extra = load_checkpoint(path, map_location="cpu")
    parts, policy = trainer.parts, trainer.policy
    policy.load_adapter_state_dict(tensors["train"], "train")
    policy.load_adapter_state_dict(tensors["old"], "old")
    parts.optimizer.load_state_dict(extra["optimizer"])
    if parts.ema is not None:
        shadow = [tensors["ema"][k] for k in sorted(tensors["ema"])]
        parts.ema.load_state_dict({**extra["ema"], "shadow": shadow})
    parts.balancer_state.clear()
    parts.balancer_state.update(extra["balancer"])
    parts.window.load_state_dict(extra["window"])
    for key, value in extra["loop"].items():
        setattr(trainer.state, key, value)
    restore_rng_state(extra["rng"])
    trainer.dist.print(f"[flowrl] resumed from {path} at iteration {trainer.state.iteration}")
    return True
