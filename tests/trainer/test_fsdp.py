"""FSDP2 (torch ``fully_shard``) on two CPU processes (torchrun, gloo), issue #17 item 1: tiny toy runs of
``fsdp_worker.py``, compared with the same runs unsharded on two processes and on one.

One torchrun launch runs every two-process case in one process group (fixture ``runs``); the one-process cases
run before (``grpo_one``, whose checkpoint a sharded run resumes) and after it (``grpo_one_from_fsdp``,
a sharded run's checkpoint resumed on one process). The launches start in the background once collection has
selected a test here (fsdp_runs.py), so they overlap the rest of the suite.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import fsdp_runs  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return fsdp_runs.wait(tmp_path_factory)


def load(out: Path, case: str, rank: int = 0) -> dict:
    return torch.load(out / f"{case}_rank{rank}.pt", weights_only=True)


def tensors_of(result: dict) -> dict:
    """Every tensor a checkpoint holds, flat: weight sets, EMA, optimizer state."""
    flat = {f"{g}/{k}": v for g, group in result["tensors"].items() for k, v in group.items()}
    flat |= {f"opt/{i}/{k}": v for i, s in result["optimizer"]["state"].items() for k, v in s.items()}
    return flat


def assert_same(a: dict, b: dict, atol: float, rtol: float = 0.0) -> None:
    ta, tb = tensors_of(a), tensors_of(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        torch.testing.assert_close(ta[k], tb[k], atol=atol, rtol=rtol, msg=lambda m, k=k: f"{k}: {m}")
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]


def assert_bitwise(a: dict, b: dict) -> None:
    ta, tb = tensors_of(a), tensors_of(b)
    assert ta.keys() == tb.keys()
    assert all(torch.equal(ta[k], tb[k]) for k in ta), [k for k in ta if not torch.equal(ta[k], tb[k])]
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    counters = ("iteration", "global_step", "rollout_nfe", "skipped_updates")
    assert all(a["loop"][c] == b["loop"][c] for c in counters)


def trained(result: dict) -> bool:
    """The "train" weights moved (a comparison of two runs is not vacuous)."""
    final, initial = result["tensors"]["train"], result["initial"]
    return any(not torch.equal(final[k], initial[k]) for k in initial)


@pytest.mark.parametrize("case, unsharded", [("grpo_fsdp", "grpo_ddp"), ("nft_full_fsdp", "nft_full_ddp"),
                                             ("uneven_fsdp", "uneven_ddp"), ("grpo_fsdp_each_pass", "grpo_ddp"),
                                             ("zimage_fsdp", "zimage_ddp")])
def test_sharded_equals_unsharded_on_two_processes(runs, case, unsharded):
    """GRPO + LoRA + evaluation, NFT + full fine-tuning + MARBLE's Gram + EMA, samples left out on one process
    only, gradients reduce-scattered after every backward (dist.reduce_per_step=false), and a diffusers family
    (tiny Z-Image with CFG: list inputs, three block lists): FSDP ends ≤ 1e-6 from the same run with gradients
    all-reduced."""
    fsdp, ddp = load(runs, case), load(runs, unsharded)
    assert fsdp["sharded"] and not ddp["sharded"] and fsdp["world"] == ddp["world"] == 2
    assert trained(fsdp) and fsdp["loop"]["global_step"] == ddp["loop"]["global_step"] > 0
    assert_same(fsdp, ddp, atol=1e-6)


def test_sharded_equals_one_process_with_the_same_global_batch(runs):
    one, fsdp = load(runs, "grpo_one"), load(runs, "grpo_fsdp")
    assert one["world"] == 1 and trained(one)
    assert_same(fsdp, one, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case", ["grpo_fsdp", "nft_full_fsdp"])
def test_kill_and_resume_under_fsdp_is_bitwise_identical(runs, case):
    """Resumed (sharded) from the checkpoint of iteration 1, as a kill after that save leaves the run: the
    weights, EMA, optimizer state and counters equal the uninterrupted run's bit for bit."""
    assert_bitwise(load(runs, f"{case}_resumed"), load(runs, case))


def test_checkpoints_move_between_one_process_and_fsdp(runs):
    """A one-process checkpoint resumes sharded, a sharded checkpoint on one process; both end where the run
    they were cut from ends (float tolerance: the other layout sums in another order)."""
    assert load(runs, "grpo_fsdp_from_one")["sharded"] and load(runs, "grpo_one_from_fsdp")["world"] == 1
    assert_same(load(runs, "grpo_fsdp_from_one"), load(runs, "grpo_one"), atol=1e-6, rtol=1e-5)
    assert_same(load(runs, "grpo_one_from_fsdp"), load(runs, "grpo_fsdp"), atol=1e-6, rtol=1e-5)


def test_each_process_holds_only_its_shard(runs):
    """Full fine-tuning: the transformers' parameters (trainable, "old", base) and the AdamW state per process
    are ≤ 0.55× of the unsharded run's (dim-0 halves); the text encoder is not sharded."""
    for rank in (0, 1):
        fsdp, ddp = load(runs, "nft_full_fsdp", rank)["bytes"], load(runs, "nft_full_ddp", rank)["bytes"]
        ratio = (fsdp["params"] + fsdp["optimizer"]) / (ddp["params"] + ddp["optimizer"])
        print(f"rank {rank}: parameter + optimizer bytes sharded {fsdp['params'] + fsdp['optimizer']} / "
              f"unsharded {ddp['params'] + ddp['optimizer']} = {ratio:.4f}")
        assert ratio <= 0.55
        assert fsdp["text_encoder"] == ddp["text_encoder"]


def test_a_nan_loss_on_one_process_skips_the_step_everywhere(runs):
    """Rank 0's loss is NaN: both processes keep making the same passes (no deadlock), the step is skipped on
    both, and the weights stay as they started."""
    for rank, reason in ((0, "loss/bad_term"), (1, "loss/other_process")):
        r = load(runs, "nan_loss_fsdp", rank)
        assert r["loop"]["global_step"] == 0 and r["loop"]["skip_reasons"] == {reason: 1}
    r = load(runs, "nan_loss_fsdp")
    assert not trained(r)


def test_bf16_blocks_compute_in_bf16(runs):
    """run.mixed_precision=bf16 under FSDP: a block gathers bf16 weights and gets bf16 inputs, the stored
    weights and the velocity stay float32, and the first step's gradient norm is within 10% of float32's."""
    import json

    bf16, fp32 = load(runs, "bf16_fsdp"), load(runs, "fp32_fsdp")
    assert bf16["dtypes"] == {"block_weight": "torch.bfloat16", "block_input": "torch.bfloat16",
                              "stored": "torch.float32", "velocity": "torch.float32"}
    assert fp32["dtypes"]["block_weight"] == "torch.float32"

    def grad_norm(case):
        recs = [json.loads(line) for line in (runs / case / "metrics.jsonl").read_text().splitlines()]
        return next(r["train/grad_norm"] for r in recs if "train/grad_norm" in r)

    assert trained(bf16) and abs(grad_norm("bf16_fsdp") / grad_norm("fp32_fsdp") - 1) < 0.1
