"""Run by test_fsdp_dcp.py, under torchrun (2 CPU processes, gloo) or alone: ``fsdp_worker``'s runs plus the cases
of sharded (DCP) checkpoints. ``*_full`` cases save with ``layout="full"`` (a sharded run gathering full tensors
onto the main process, the checkpoint format before DCP), so each DCP result has a full-gather twin; ``*_async``
cases save asynchronously.

    python -m torch.distributed.run --nproc_per_node 2 dcp_worker.py OUT grpo_fsdp grpo_fsdp_full ...
"""
from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import fsdp_worker  # noqa: E402
import torch  # noqa: E402
from fsdp_worker import barrier, cut_copy, is_main  # noqa: E402

import flowrl.training.trainer as trainer_module  # noqa: E402
from flowrl.checkpoint.resume import finish_saves, save_run  # noqa: E402
from flowrl.config import load_resolved  # noqa: E402

fsdp_worker.CASES["grpo_fsdp_full"] = lambda out: fsdp_worker.grpo(out, "grpo_fsdp_full") + fsdp_worker.SHARDED
fsdp_worker.CASES["grpo_fsdp_async"] = lambda out: (fsdp_worker.grpo(out, "grpo_fsdp_async") + fsdp_worker.SHARDED
                                                     + ["checkpoint.async_save=true"])
# one process resuming iteration 1 of a sharded run: from its DCP checkpoint / from its full-gather twin's
fsdp_worker.RESUMED["grpo_one_from_fsdp_full"] = ("grpo_fsdp_full", False)
# restore only (no training): iteration 1's DCP checkpoint of grpo_fsdp into this launch's processes, whatever
# their count, then gathered whole (``restore_only``)
fsdp_worker.RESUMED["restored_from_two"] = ("grpo_fsdp", True)
DAMAGED = "grpo_fsdp_damaged"          # grpo_fsdp resumed with rank 0's shard of its last checkpoint corrupted


def damaged_copy(out: Path) -> Path:
    """``out/grpo_fsdp_damaged``: run grpo_fsdp with one byte of ``dcp/__0_0.distcp`` of its newest checkpoint
    flipped (same size: only its sha256 tells, which process 1 checks), so resuming must pass over it."""
    dst = out / DAMAGED
    if is_main():
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(out / "grpo_fsdp", dst)
        shard = max((dst / "checkpoints").glob("step_*")) / "dcp" / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    barrier()
    return dst


def restore_only(out: Path, case: str) -> None:
    """``<case>_rank<r>.pt``: the state the run holds right after resuming, gathered whole (rank 0 complete)."""
    from accelerate.state import AcceleratorState

    from flowrl.checkpoint.resume import snapshot
    from flowrl.training.trainer import Trainer

    AcceleratorState._reset_state()
    trainer = Trainer(fsdp_worker.config_of(out, case))
    trainer.open_run_dir()
    tensors, extra = snapshot(trainer.run_state)
    result = {"tensors": tensors, "optimizer": extra["optimizer"], "loop": trainer.state.as_dict(),
              "world": trainer.dist.world, "sharded": trainer.dist.sharded}
    torch.save(result, out / f"{case}_rank{trainer.dist.rank}.pt")


def run_case(out: Path, case: str) -> None:
    """``*_async``: ``checkpoint.async_save=true``, every save asynchronous (each completed at the next save,
    the last at the run's end)."""
    layout = "full" if case.endswith("_full") else "auto"
    trainer_module.save_run = functools.partial(save_run, layout=layout)
    if case.startswith("restored_"):
        return restore_only(out, case)
    if case == DAMAGED:
        original, fsdp_worker.config_of = fsdp_worker.config_of, lambda out, case: load_resolved(
            damaged_copy(out), ["run.resume=true"])
        try:
            fsdp_worker.run_case(out, case)
        finally:
            fsdp_worker.config_of = original
    else:
        fsdp_worker.run_case(out, case)
    finish_saves()


__all__ = ["cut_copy", "run_case"]

if __name__ == "__main__":
    torch.set_num_threads(1)
    if "WORLD_SIZE" in os.environ and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")      # before the first case copies a run on rank 0 only
    out_dir = Path(sys.argv[1])
    for name in sys.argv[2:]:
        run_case(out_dir, name)
