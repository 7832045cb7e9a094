"""Shared helpers for the trainer tests, and the hook that starts test_fsdp.py's launches early."""
import sys
from pathlib import Path


def toy_overrides(tmp_path, objective: str = "grpo", name: str = "run", iterations: int = 2) -> list[str]:
    """A tiny toy-world run: 2 prompts × 2 samples, 3 steps, eval on 2 held-out prompts."""
    sde = objective == "grpo"
    return [
        "policy.kind=toy", "policy.tiny=true", "policy.lora={rank: 2, alpha: 4}",
        f"objective.kind={objective}", f"sampler.kernel.kind={'flow_sde' if sde else 'ode'}",
        "sampler.steps=3", "sampler.eval_steps=2", "sampler.height=32", "sampler.width=32", "sampler.guidance=1.0",
        "rewards={shapes: 1.0}", f"train.iterations={iterations}", "train.prompts_per_iter=2",
        "train.group_size=2", "train.micro_batch=2", "sampler.chunk=2", "train.updates_per_epoch=2",
        "train.ema_every=1",
        *([] if sde else ["objective.timesteps.fraction=0.7"]),
        "eval.num_prompts=2", "eval.seeds=[0]", "eval.every=0", "eval.batch=2",
        f"run.output_dir={tmp_path}", f"run.name={name}", "log.progress=false", "checkpoint.every=1",
        "checkpoint.keep=5",
    ]



def pytest_collection_finish(session):
    """Start test_fsdp.py's and test_fsdp_dcp.py's launch in the background when a test of either is selected
    (fsdp_runs.py)."""
    files = {"test_fsdp.py", "test_fsdp_dcp.py"}
    if session.config.option.collectonly or not any(item.path.name in files for item in session.items):
        return
    sys.path.insert(0, str(Path(__file__).parent))
    import fsdp_runs

    fsdp_runs.start(session.config._tmp_path_factory.mktemp("fsdp"))


def pytest_sessionfinish(session):
    if "fsdp_runs" in sys.modules:
        sys.modules["fsdp_runs"].finish()
