"""Save and restore the whole state of an RL run, for exact resume.

A checkpoint (``flowrl.checkpoint.store``, atomic) holds tensor groups ``train`` and ``old`` (the LoRA adapters,
or the full transformer weights), ``ema`` (the eval-EMA shadow), and a state dict with the optimizer, the loop
counters (iteration = data position, optimizer steps, rollout NFEs, skip counts), the balancer state (MARBLE's
α-EMA), the objective's state (its ``end_iteration`` hook), the window position (MixGRPO) and every RNG.
Every rollout's noise and every training draw come from generators derived from (seed, iteration, ...), so
after ``load_run`` the run continues bitwise identically on CPU (``tests/trainer/test_resume.py``).

A sharded (FSDP) run writes its checkpoints sharded (``flowrl.checkpoint.sharded``: each process its DCP chunks, no
gather) and restores them through DCP on any process count, or whole on one process; docs/training.md "Sharded
checkpoints (DCP)".

Faults (docs/training.md "Faults"): ``load_run`` resumes from the newest checkpoint that loads and fits the
run, naming any newer one it had to pass over; with checkpoint directories present but none loadable it
refuses (``CheckpointError`` naming each and why) instead of silently starting over; with no checkpoint at
all (killed before the first save) it starts from iteration 0. ``prepare_fresh_run`` refuses to start a new
run over a directory that holds checkpoints, unless asked to restart (it then deletes them).
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.checkpoint import sharded
from flowrl.checkpoint.store import (
    CHECKPOINTS_DIR,
    CheckpointError,
    capture_rng_state,
    incomplete_checkpoints,
    list_checkpoints,
    load_checkpoint,
    read_manifest,
    restore_rng_state,
    save_checkpoint,
)

STATE_KEYS = ("optimizer", "loop", "balancer", "window", "rng")
RUN_FILES = (CHECKPOINTS_DIR, "metrics.jsonl", "tb")      # what a restart deletes: the old run's record


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
    sharding: Any = None               # flowrl.distributed.fsdp.Sharding of a sharded (FSDP) run


_PENDING: list = []          # the asynchronous sharded save in flight (flowrl.checkpoint.sharded.PendingSave)


def save_run(run_dir: Path, s: RunState, keep: int, dist, layout: str = "auto", async_save: bool = False
             ) -> Path | None:
    """Write a checkpoint of the current iteration, then wait for every process; its path on the main process.
    ``layout`` "auto": a sharded run writes a sharded (DCP) checkpoint, each process its own chunks
    (``save_sharded``), an unsharded run the full one; "full": a sharded run gathers full tensors first, every
    process taking part, and the main process writes the checkpoint one process writes. ``async_save`` (sharded
    only): the shards are written while training goes on; the checkpoint is completed at the next save or by
    ``finish_saves`` (returns the previous checkpoint's path, None for the first)."""
    if layout not in ("auto", "full"):
        raise ValueError(f"checkpoint layout must be 'auto' or 'full', got {layout!r}")
    previous = finish_saves()
    if s.sharding is not None and layout == "auto":
        saved = save_sharded(run_dir, s, keep, async_save)
        if async_save:
            _PENDING.append(saved)
            return previous
        return saved
    path = None
    if dist.is_main or s.sharding is not None:
        tensors, extra = snapshot(s, keep=dist.is_main)
    if dist.is_main:
        extra.update(small_state(s))
        path = save_checkpoint(run_dir, s.loop.iteration, tensors, extra, keep_last=keep)
    dist.barrier()
    return path


def finish_saves() -> Path | None:
    """Complete the asynchronous save in flight, if any (every process; at the next save and at the end of a
    run); its checkpoint's path on the main process."""
    return _PENDING.pop().finish() if _PENDING else None


def small_state(s: RunState) -> dict:
    """What every checkpoint holds besides tensors: loop counters, balancer, objective, window, RNG."""
    return {"loop": s.loop.as_dict(), "balancer": dict(s.balancer_state), "objective": dict(s.objective_state),
            "window": s.window.state_dict(), "rng": capture_rng_state()}


def save_sharded(run_dir: Path, s: RunState, keep: int, asynchronous: bool = False):
    """A sharded run's checkpoint (``flowrl.checkpoint.sharded``): the weight sets, EMA shadow and optimizer
    moments as each process's DTensor chunks, no gather; the small state from the main process, with every
    process's RNG states (``rng_ranks``) and the optimizer's parameter names and param_groups."""
    from flowrl.distributed import fsdp

    tensors = {name: s.policy.adapter_state_dict(name) for name in s.policy.weight_sets()}
    tensors["optimizer"] = fsdp.sharded_optimizer_state(s.sharding, s.optimizer)
    state = small_state(s)
    state["rng_ranks"] = sharded.all_gather(state["rng"])
    state["optimizer_names"] = fsdp.parameter_names(s.sharding.module, s.optimizer)
    state["optimizer_param_groups"] = s.optimizer.state_dict()["param_groups"]
    if s.ema is not None:
        state["ema"] = {k: v for k, v in s.ema.state_dict().items() if k != "shadow"}
        tensors["ema"] = {f"{i:05d}": t for i, t in enumerate(s.ema.shadow)}
    return sharded.save(run_dir, s.loop.iteration, tensors, state, keep_last=keep, asynchronous=asynchronous)


def snapshot(s: RunState, keep: bool = True) -> tuple[dict, dict]:
    """The weight sets, EMA shadow and optimizer state as full CPU tensors (``flowrl.distributed.fsdp``; sharded
    tensors are gathered, a collective); a process that does not ``keep`` takes part and gets nothing."""
    from flowrl.distributed import fsdp

    tensors = {name: fsdp.full_tensors(s.policy.adapter_state_dict(name), keep) for name in s.policy.weight_sets()}
    if s.sharding is not None:
        extra = {"optimizer": fsdp.optimizer_state_dict(s.sharding, s.optimizer)}
    else:
        extra = {"optimizer": s.optimizer.state_dict()}
    if s.ema is not None:
        ema = s.ema.state_dict()
        shadow = fsdp.full_tensors({f"{i:05d}": t for i, t in enumerate(ema.pop("shadow"))}, keep)
        tensors["ema"], extra["ema"] = shadow, ema
    return tensors, extra


def load_run(run_dir: Path, s: RunState, dist) -> bool:
    """Restore the newest loadable checkpoint of ``run_dir`` into ``s`` (True), or start from scratch when the
    run has no checkpoint directory at all (False). CheckpointError when there are checkpoint directories but
    none can be restored, naming each and why."""
    complete, incomplete = list_checkpoints(run_dir), incomplete_checkpoints(run_dir)
    if not complete and not incomplete:
        dist.print(f"[flowrl] run.resume: no checkpoint in {run_dir}; starting from iteration 0")
        return False
    failures = [f"{p.name}: no manifest.json" for p in incomplete]
    for step, path in reversed(complete):
        try:
            restore(path, s)
        except CheckpointError as e:
            failures.append(f"{path.name}: {e}")
            continue
        passed = [f for f in failures if _step_of(f) > step]
        if passed:
            dist.print(f"[flowrl] run.resume: passed over damaged checkpoints ({'; '.join(passed)})")
        dist.print(f"[flowrl] resumed from {path} at iteration {s.loop.iteration}")
        return True
    raise CheckpointError(f"cannot resume {run_dir}: no checkpoint can be restored ({'; '.join(failures)}); "
                          "restore the files, or start the run over with --restart (run.restart=true, deletes "
                          "its checkpoints)")


def _step_of(failure: str) -> int:
    return int(failure.split(":", 1)[0].removeprefix("step_"))


def restore(path: Path, s: RunState) -> None:
    """Load checkpoint ``path`` into ``s``; CheckpointError naming the file when it is damaged, lacks a part
    the run needs, or does not fit the run's model / optimizer (e.g. a changed LoRA rank)."""
    manifest = read_manifest(path)
    if sharded.is_sharded_checkpoint(manifest) and s.sharding is not None:
        return restore_sharded(path, manifest, s)
    tensors, extra = load_checkpoint(path, map_location="cpu")
    needed = s.policy.weight_sets() + (["ema"] if s.ema is not None else [])
    missing = [g for g in needed if g not in tensors]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} has no tensor group {missing[0]!r} (groups: "
                              f"{sorted(tensors)}); it was not written by the trainer or is damaged")
    _check_state(path, extra, s, STATE_KEYS)
    try:
        apply(tensors, extra, s)
    except (KeyError, ValueError, RuntimeError, TypeError, IndexError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit this run ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:300]}); was the model, LoRA or optimizer config "
                              "changed since it was written?") from e


def _check_state(path: Path, extra: dict, s: RunState, keys: tuple) -> None:
    missing = [k for k in (*keys, *(["ema"] if s.ema is not None else [])) if k not in extra]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r}: state.pt has no {missing[0]!r} entry (has: "
                              f"{sorted(extra)}); it was not written by the trainer or is damaged")


def restore_sharded(path: Path, manifest: dict, s: RunState) -> None:
    """Load sharded checkpoint ``path`` into a sharded run (every process; any process count: DCP reads the
    chunks of this process's layout, resharding when it differs from the writer's)."""
    from flowrl.distributed import fsdp

    sharded.verify(path, manifest)
    extra = sharded.read_state(path)
    _check_state(path, extra, s, ("loop", "balancer", "window", "rng", "optimizer_names", "optimizer_param_groups"))
    targets = {name: s.policy.adapter_state_dict(name) for name in s.policy.weight_sets()}
    targets["optimizer"] = fsdp.sharded_optimizer_state(s.sharding, s.optimizer)
    if s.ema is not None:
        targets["ema"] = {f"{i:05d}": t.clone() for i, t in enumerate(s.ema.shadow)}
    sharded.load_into(path, targets)
    try:
        for name in s.policy.weight_sets():
            s.policy.load_adapter_state_dict(targets[name], name)
        fsdp.load_sharded_optimizer_state(s.sharding, s.optimizer, targets["optimizer"],
                                          extra["optimizer_param_groups"])
        if s.ema is not None:
            s.ema.load_state_dict({**extra["ema"], "shadow": [targets["ema"][k] for k in sorted(targets["ema"])]})
    except (KeyError, ValueError, RuntimeError, TypeError, IndexError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit this run ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:300]})") from e
    apply_small(extra, s)


def apply(tensors: dict, extra: dict, s: RunState) -> None:
    """Put a checkpoint's tensors and state into the run's objects (a sharded run cuts each full tensor into
    this process's chunk: the checkpoint is the same whether it was written sharded or not)."""
    from flowrl.distributed import fsdp

    split = s.sharding is not None
    for name in s.policy.weight_sets():                 # "train", "old" and extra adapters (GARDO's "ref")
        state = fsdp.shard_state(tensors[name], s.policy.adapter_state_dict(name)) if split else tensors[name]
        s.policy.load_adapter_state_dict(state, name)
    if split:
        fsdp.load_optimizer_state_dict(s.sharding, s.optimizer, extra["optimizer"])
    else:
        s.optimizer.load_state_dict(extra["optimizer"])
    if s.ema is not None:
        shadow = [tensors["ema"][k] for k in sorted(tensors["ema"])]
        if split:
            shadow = [fsdp.shard_like(t, like) for t, like in zip(shadow, s.ema.shadow)] + shadow[len(s.ema.shadow):]
        s.ema.load_state_dict({**extra["ema"], "shadow": shadow})
    apply_small(extra, s)


def apply_small(extra: dict, s: RunState) -> None:
    """The non-tensor state into the run; each process takes its own RNG states where the checkpoint has them
    (``rng_ranks`` of a sharded checkpoint written by as many processes or more), the main process's otherwise."""
    s.balancer_state.clear()
    s.balancer_state.update(extra["balancer"])
    s.objective_state.clear()
    s.objective_state.update(extra.get("objective", {}))
    s.window.load_state_dict(extra["window"])
    for key, value in extra["loop"].items():
        setattr(s.loop, key, value)
    rank, ranks = sharded.rank_world()[0], extra.get("rng_ranks", [])
    restore_rng_state(ranks[rank] if rank < len(ranks) else extra["rng"])


def prepare_fresh_run(run_dir: Path, restart: bool, dist) -> None:
    """Before a new (not resumed) run: refuse a run directory that holds checkpoints — a later resume would
    mix the two runs — unless ``restart``, which deletes the old checkpoints, metrics.jsonl and TensorBoard
    logs first (main process; the others wait)."""
    run_dir = Path(run_dir)
    found = sorted(p.name for p in (run_dir / CHECKPOINTS_DIR).glob("step_*")) if run_dir.is_dir() else []
    if found and not restart:
        shown = ", ".join(found[-3:]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise CheckpointError(f"{run_dir} already holds checkpoints ({shown}): continue that run with --resume "
                              f"{run_dir}, start it over with --restart (deletes them), or choose another "
                              "run.name")
    if restart and dist.is_main:
        for name in RUN_FILES:
            p = run_dir / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        if found:
            dist.print(f"[flowrl] run.restart: deleted {len(found)} checkpoint(s) of the previous run in {run_dir}")
    dist.barrier()
