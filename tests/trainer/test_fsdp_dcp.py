"""Sharded (DCP) checkpoints of FSDP runs on two CPU processes (torchrun, gloo): each process writes its own shards,
and the checkpoint resumes bitwise on two processes and on one (``dcp_worker.py``; issue: cluster operation,
item 1). The two-process cases run in test_fsdp.py's torchrun launch (fsdp_runs.py); the one-process resumes run
in the pytest process after it.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import dcp_worker  # noqa: E402
import fsdp_runs  # noqa: E402
from test_fsdp import assert_bitwise, load, trained  # noqa: E402

from flowrl.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, read_manifest  # noqa: E402

WORKER = Path(__file__).with_name("dcp_worker.py")
TWO_PROCESS_CASES = ["grpo_fsdp", "grpo_fsdp_full", "grpo_fsdp_async", dcp_worker.DAMAGED]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The cases of this file run in test_fsdp.py's launch (fsdp_runs.py: one torchrun for both files, started
    in the background after collection), ``TWO_PROCESS_CASES`` among its cases."""
    assert set(TWO_PROCESS_CASES) <= set(fsdp_runs.TWO_PROCESS_CASES)
    return fsdp_runs.wait(tmp_path_factory)


def assert_same_run(runs: Path, case: str, reference: str) -> None:
    """Rank 0's whole state (weights, EMA, optimizer, counters) bitwise the reference's, rank 1's counters."""
    assert_bitwise(load(runs, case), load(runs, reference))
    loops = [{k: v for k, v in load(runs, c, 1)["loop"].items() if k != "wall_time"} for c in (case, reference)]
    assert loops[0] == loops[1]


def test_each_process_writes_its_own_shards(runs):
    """A sharded run's checkpoints are DCP directories with one shard file per process, listed (size, sha256) in
    the manifest; its full-gather twin (layout="full") writes today's one-process format."""
    for _, path in list_checkpoints(runs / "grpo_fsdp"):
        manifest = read_manifest(path)
        assert manifest["layout"] == "dcp" and manifest["world"] == 2
        assert {"dcp/__0_0.distcp", "dcp/__1_0.distcp", "dcp/.metadata", "state.pt"} <= set(manifest["files"])
        assert not list(path.glob("*.safetensors"))
    full = read_manifest(latest_checkpoint(runs / "grpo_fsdp_full"))
    assert "layout" not in full and "train.safetensors" in full["files"]


def test_read_whole_on_one_process_it_is_the_full_gather_checkpoint(runs):
    """Read on one process, a DCP checkpoint holds bit for bit what the full-gather path writes for the same run
    (weights, EMA, optimizer state and param_groups, counters, the main process's RNG), and what the finished
    run's state gathers to."""
    dcp_t, dcp_s = load_checkpoint(latest_checkpoint(runs / "grpo_fsdp"))
    full_t, full_s = load_checkpoint(latest_checkpoint(runs / "grpo_fsdp_full"))
    assert assert_bitwise({"tensors": dcp_t, "optimizer": dcp_s["optimizer"], "loop": dcp_s["loop"]},
                          {"tensors": full_t, "optimizer": full_s["optimizer"], "loop": full_s["loop"]}) is None
    assert_bitwise({"tensors": dcp_t, "optimizer": dcp_s["optimizer"], "loop": dcp_s["loop"]}, load(runs, "grpo_fsdp"))
    for key in ("balancer", "objective", "window", "ema"):
        assert dcp_s[key] == full_s[key], key
    assert torch.equal(dcp_s["rng"]["torch"], full_s["rng"]["torch"]) and len(dcp_s["rng_ranks"]) == 2
    assert torch.equal(dcp_s["rng_ranks"][0]["torch"], dcp_s["rng"]["torch"])


def test_the_checkpoint_format_leaves_training_unchanged(runs):
    assert trained(load(runs, "grpo_fsdp"))
    assert_same_run(runs, "grpo_fsdp", "grpo_fsdp_full")


def test_resumed_on_two_processes_past_a_damaged_shard_bitwise(runs):
    """The newest checkpoint's rank-0 shard fails its sha256 (checked by process 1): both processes pass over it,
    naming it, resume iteration 1 from the one before, and end bitwise where the uninterrupted run ends."""
    log = (runs / "launch.log").read_text()
    assert "passed over damaged checkpoints (step_00000002: checkpoint" in log
    assert "dcp/__0_0.distcp fails its sha256 check" in log
    assert f"resumed from {runs / dcp_worker.DAMAGED / 'checkpoints' / 'step_00000001'}" in log
    assert_same_run(runs, dcp_worker.DAMAGED, "grpo_fsdp")


def test_resumed_on_one_process_bitwise(runs):
    """Two processes' DCP checkpoint of iteration 1 resumed on one process (whole tensors, DCP resharding to one
    unsharded layout) ends bit for bit where the same resume from the full-gather checkpoint ends."""
    one, twin = load(runs, "grpo_one_from_fsdp"), load(runs, "grpo_one_from_fsdp_full")
    assert one["world"] == 1 and not one["sharded"] and one["loop"]["iteration"] == 2
    assert_bitwise(one, twin)


@pytest.mark.slow
def test_resharded_onto_four_processes(tmp_path):
    """Resharding to another process count: iteration 1's checkpoint of a 2-process run, restored by 4 processes
    (each reads its quarter through DCP's planner) and gathered whole, equals the checkpoint read whole bit for
    bit (4 CPU processes: slow)."""
    from launchers import free_port, launch

    launch(lambda: [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                    "127.0.0.1", "--master_port", str(free_port()), str(WORKER), str(tmp_path), "grpo_fsdp"], 600)
    launch(lambda: [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "--master_addr",
                    "127.0.0.1", "--master_port", str(free_port()), str(WORKER), str(tmp_path),
                    "restored_from_two"], 600)
    restored = load(tmp_path, "restored_from_two")
    assert restored["world"] == 4 and restored["sharded"] and restored["loop"]["iteration"] == 1
    tensors, state = load_checkpoint(list_checkpoints(tmp_path / "grpo_fsdp")[0][1])
    assert_bitwise(restored, {"tensors": tensors, "optimizer": state["optimizer"], "loop": state["loop"]})


def test_converter_and_export_script(runs, tmp_path):
    """scripts/export.py --format full-state: the DCP checkpoint as one torch.save file of full tensors."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("export_script", Path(__file__).parents[2] / "scripts" / "export.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    info = script.main([str(runs / "grpo_fsdp"), "--step", "1", "--format", "full-state", "--out", str(tmp_path)])
    assert info["layout"] == "dcp" and info["step"] == 1
    single = torch.load(info["out"], weights_only=True)
    tensors, state = load_checkpoint(list_checkpoints(runs / "grpo_fsdp")[0][1])
    assert all(torch.equal(single["tensors"][g][k], v) for g in tensors for k, v in tensors[g].items())
    assert single["state"]["loop"] == state["loop"]


def test_asynchronous_saves_write_the_same_checkpoints(runs):
    """Every save asynchronous (completed at the next save, the last after the run): the same checkpoints, read
    whole, as the synchronous run's, and the same training."""
    steps = [step for step, _ in list_checkpoints(runs / "grpo_fsdp_async")]
    assert steps == [step for step, _ in list_checkpoints(runs / "grpo_fsdp")] == [1, 2]
    assert not list((runs / "grpo_fsdp_async" / "checkpoints").glob(".tmp-*"))
    for (_, a), (_, b) in zip(list_checkpoints(runs / "grpo_fsdp_async"), list_checkpoints(runs / "grpo_fsdp")):
        (at, as_), (bt, bs) = load_checkpoint(a), load_checkpoint(b)
        assert_bitwise({"tensors": at, "optimizer": as_["optimizer"], "loop": as_["loop"]},
                       {"tensors": bt, "optimizer": bs["optimizer"], "loop": bs["loop"]})
    assert_same_run(runs, "grpo_fsdp_async", "grpo_fsdp")
