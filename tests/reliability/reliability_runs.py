"""Helpers of the reliability tests: tiny toy runs, scripts/train.py loaded by path, the fault-injection
library ``flowrl.bench.faults`` (shared with ``bench.py reliability``)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def load_path(name: str, path: Path):
    """A module loaded from a file path under a unique name (scripts/ is not a package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def train_script():
    return load_path("flowrl_reliability_train_script", REPO / "scripts" / "train.py")


def faults():
    from flowrl.bench import faults as module

    return module


def tiny(out_dir, name: str = "run", iterations: int = 2, objective: str = "nft") -> list[str]:
    """Overrides of a tiny toy run (2 prompts × 2 samples, 2 steps, a checkpoint every iteration, no eval)."""
    kernel = "flow_sde" if objective == "grpo" else "ode"
    extra = [] if objective == "grpo" else ["objective.timesteps.fraction=0.5"]
    return ["policy.kind=toy", "policy.tiny=true", "policy.lora={rank: 2, alpha: 4}", f"objective.kind={objective}",
            f"sampler.kernel.kind={kernel}", "sampler.steps=2", "sampler.eval_steps=2", "sampler.height=32",
            "sampler.width=32", "sampler.guidance=1.0", "rewards={shapes: 1.0}", f"train.iterations={iterations}",
            "train.prompts_per_iter=2", "train.group_size=2", "train.micro_batch=2", "train.updates_per_epoch=2",
            "train.ema_every=1", "eval.before=false", "eval.after=false", "log.progress=false",
            "checkpoint.every=1", "checkpoint.keep=5", f"run.output_dir={out_dir}", f"run.name={name}", *extra]


def adapter(trainer) -> dict:
    return {k: v.clone() for k, v in trainer.policy.adapter_state_dict("train").items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
