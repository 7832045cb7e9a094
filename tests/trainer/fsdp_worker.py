"""Run by test_fsdp.py, under torchrun (2 CPU processes, gloo) or alone: tiny toy runs named on the command line,
one after another in one process group. Each writes ``<out>/<case>_rank<r>.pt``: the run's checkpoint contents
as full tensors (weight sets, EMA, optimizer in ``optimizer.state_dict()`` layout; complete on rank 0), the
"train" weights it started from, its counters, the bytes this process holds for the transformers' parameters and
the optimizer state, and the dtypes a transformer block computes in.

    python -m torch.distributed.run --nproc_per_node 2 fsdp_worker.py OUT grpo_fsdp grpo_ddp ...
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import rank0_faults  # noqa: E402,F401  (registers the reward test_nan_on_rank0)
from conftest import toy_overrides  # noqa: E402

from flowrl.checkpoint.resume import snapshot  # noqa: E402
from flowrl.checkpoint.store import list_checkpoints  # noqa: E402
from flowrl.config import load_config, load_resolved  # noqa: E402
from flowrl.distributed.fsdp import full_tensors, local_bytes  # noqa: E402
from flowrl.training.trainer import Trainer  # noqa: E402

SHARDED = ["dist.fsdp=true"]
NO_EVAL = ["eval.before=false", "eval.after=false"]


def grpo(out: Path, name: str, iterations: int = 2) -> list[str]:
    """GRPO on the LoRA adapters, one optimizer step per iteration (every step sees the whole global batch, so
    one process trains the same as two), evaluation before and after (every process samples under FSDP)."""
    return [*toy_overrides(out, "grpo", name, iterations), "run.cpu=true", "train.updates_per_epoch=1",
            "train.micro_batch=1", "sampler.chunk=1", "rewards={jpeg_compressibility: 1.0}", "eval.before=true",
            "eval.after=true"]


def nft_full(out: Path, name: str) -> list[str]:
    """NFT fine-tuning every transformer weight ("old" and the base are frozen sharded copies), MARBLE over two
    rewards (its per-reward gradient Gram runs through the sharded backward), the eval EMA."""
    return [*toy_overrides(out, "nft", name, 2), "run.cpu=true", "policy.lora=null", "train.micro_batch=1",
            "sampler.chunk=1",
            "advantage.balancer={kind: marble, solve_every: 1}",
            "rewards={jpeg_compressibility: 1.0, shapes_ink_budget: 0.5}", *NO_EVAL]


def uneven(out: Path, name: str) -> list[str]:
    """GRPO where rank 0 leaves a sample out (its reward is NaN): rank 0 has one micro-batch less."""
    return [*grpo(out, name, 1), "rewards={test_nan_on_rank0: 1.0}", *NO_EVAL]


def nan_loss(out: Path, name: str) -> list[str]:
    """GRPO whose loss is NaN on rank 0: every optimizer step is skipped, on every process."""
    objective = Path(__file__).with_name("rank0_faults.py")
    return [*grpo(out, name, 1), f"objective.kind={objective}:loss", "train.max_skipped=100", *NO_EVAL]


def zimage(out: Path, name: str) -> list[str]:
    """GRPO with CFG on the tiny Z-Image (its per-sample list forward, three block lists as FSDP units)."""
    return [*grpo(out, name, 1), "policy.kind=zimage", "policy.max_sequence_length=8",
            "policy.lora={rank: 2, alpha: 4, target_modules: [to_q, to_v]}", "sampler.height=16", "sampler.width=16",
            "sampler.guidance=4.0", *NO_EVAL]


CASES = {
    "zimage_fsdp": lambda out: zimage(out, "zimage_fsdp") + SHARDED,
    "zimage_ddp": lambda out: zimage(out, "zimage_ddp"),
    "grpo_fsdp": lambda out: grpo(out, "grpo_fsdp") + SHARDED,
    "grpo_ddp": lambda out: grpo(out, "grpo_ddp"),
    "grpo_one": lambda out: grpo(out, "grpo_one"),
    "grpo_fsdp_each_pass": lambda out: [*grpo(out, "grpo_fsdp_each_pass"), "dist.reduce_per_step=false", *SHARDED],
    "nft_full_fsdp": lambda out: nft_full(out, "nft_full_fsdp") + SHARDED,
    "nft_full_ddp": lambda out: nft_full(out, "nft_full_ddp"),
    "uneven_fsdp": lambda out: uneven(out, "uneven_fsdp") + SHARDED,
    "uneven_ddp": lambda out: uneven(out, "uneven_ddp"),
    "nan_loss_fsdp": lambda out: nan_loss(out, "nan_loss_fsdp") + SHARDED,
    "bf16_fsdp": lambda out: [*grpo(out, "bf16_fsdp", 1), "run.mixed_precision=bf16", *NO_EVAL, *SHARDED],
    "fp32_fsdp": lambda out: [*grpo(out, "fp32_fsdp", 1), *NO_EVAL, *SHARDED],
    # the shipped toy model (9.5M-parameter transformer), full fine-tuning, one iteration: the memory figure
    "small_full_fsdp": lambda out: [*nft_full(out, "small_full_fsdp"), "policy.tiny=false", "policy.dtype=float32",
                                    "train.iterations=1", *SHARDED],
    "small_full_ddp": lambda out: [*nft_full(out, "small_full_ddp"), "policy.tiny=false", "policy.dtype=float32",
                                   "train.iterations=1"],
}
# case: (run, sharded): copy run's directory as it was after iteration 1 (later checkpoints deleted: as a kill
# right after that save leaves it) and resume it to the end, sharded or not
RESUMED = {"grpo_fsdp_resumed": ("grpo_fsdp", True), "nft_full_fsdp_resumed": ("nft_full_fsdp", True),
           "grpo_fsdp_from_one": ("grpo_one", True), "grpo_one_from_fsdp": ("grpo_fsdp", False)}


def is_main() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def cut_copy(out: Path, source: str, name: str) -> Path:
    """``out/<name>``: run ``source`` as a kill after iteration 1's checkpoint would have left it."""
    dst = out / name
    if is_main():
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(out / source, dst)
        for step, path in list_checkpoints(dst):
            if step > 1:
                shutil.rmtree(path)
    barrier()
    return dst


def config_of(out: Path, case: str):
    if case in CASES:
        return load_config(None, CASES[case](out))
    source, sharded = RESUMED[case]
    run_dir = cut_copy(out, source, case)
    return load_resolved(run_dir, ["run.resume=true", f"dist.fsdp={str(sharded).lower()}"])


def held_bytes(trainer: Trainer) -> dict:
    """Bytes this process holds: every transformer's parameters (trainable, frozen copies, LoRA), the optimizer
    state, and the (unsharded) text encoder."""
    policy = trainer.policy
    text_encoder = policy.pipe.text_encoder if hasattr(policy, "pipe") else policy.text_encoder   # diffusers / toy
    params = [p for module, _ in policy.shard_units() for p in module.parameters()]
    state = [v for s in trainer.parts.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"params": local_bytes(params), "optimizer": local_bytes(state),
            "text_encoder": local_bytes(list(text_encoder.parameters()))}


def block_dtypes(trainer: Trainer) -> dict:
    """The dtypes of the first block's (gathered) weight and input during one velocity call, of the
    transformer's stored weights, and of the velocity (every process calls: the forward is a collective)."""
    policy = trainer.policy
    transformer, blocks = policy.shard_units()[0]
    seen = {}

    def look(module, args, kwargs):
        seen["block_weight"] = str(next(module.parameters()).dtype)
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]     # toy: keyword; Z-Image: positional
        seen["block_input"] = str(x.dtype)

    handle = blocks[0].register_forward_pre_hook(look, with_kwargs=True)
    with torch.no_grad():
        cond = policy.encode(["a red circle"], cfg=False)
        x = policy.noise([torch.Generator().manual_seed(0)], 32, 32)
        v = policy.velocity(x, torch.tensor([0.5]), cond, 1.0)
    handle.remove()
    return {**seen, "stored": str(next(transformer.parameters()).dtype), "velocity": str(v.dtype)}


def run_case(out: Path, case: str) -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()            # keep the process group, let this case set its own precision
    trainer = Trainer(config_of(out, case))
    initial = full_tensors(trainer.policy.adapter_state_dict("train"))
    trainer.run()
    tensors, extra = snapshot(trainer.run_state)           # every process: the gathers are collectives
    result = {"tensors": tensors, "optimizer": extra["optimizer"], "loop": trainer.state.as_dict(),
              "initial": initial, "bytes": held_bytes(trainer), "dtypes": block_dtypes(trainer),
              "sharded": trainer.dist.sharded, "world": trainer.dist.world}
    torch.save(result, out / f"{case}_rank{trainer.dist.rank}.pt")


if __name__ == "__main__":
    torch.set_num_threads(1)
    out_dir = Path(sys.argv[1])
    for name in sys.argv[2:]:
        run_case(out_dir, name)
