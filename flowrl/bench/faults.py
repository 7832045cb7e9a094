"""Fault injection for the reliability benchmark and tests (issue #16): bad configs and kill -9 at random points.

``BAD_CONFIGS``: (overrides, key) pairs, each a mistake ``scripts/train.py`` must refuse before any model loads
with one line naming ``key``. ``check_bad_config`` runs train.py's ``main`` in this process with the policy
loader replaced by a trap (a config that gets that far is not refused in time) and reports what was printed.

``kill_resume_try`` trains a tiny toy run in a subprocess, SIGKILLs it at random points (``kills`` times: after
a random number of checkpoints — none: during start-up — plus a random fraction of a second, so kills land in
start-up, mid-iteration and mid-save), resumes it with ``--resume`` each time until it finishes, and compares
the final checkpoint with an uninterrupted run's: weights, EMA, optimizer state and loop counters must be
bitwise equal.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "scripts" / "train.py"
RECIPE = REPO / "configs" / "default.yaml"

# A tiny toy run: 2 prompts × 2 samples, 2 steps, no evaluation (what a bad config is checked against).
TINY = ["policy.tiny=true", "sampler.steps=2", "sampler.eval_steps=2", "rewards={shapes: 1.0}",
        "train.prompts_per_iter=2", "train.group_size=2", "train.micro_batch=2", "train.updates_per_epoch=2",
        "train.iterations=2", "eval.before=false", "eval.after=false", "log.progress=false"]

BAD_CONFIGS: list[tuple[list[str], str]] = [
    (["advantage.balancer.eps=-1"], "advantage.balancer.eps"),
    (["advantage.balancer.eps=0"], "advantage.balancer.eps"),
    (["advantage.balancer.std=gruop"], "advantage.balancer.std"),
    (["advantage.balancer={kind: dara, variant: sim}"], "advantage.balancer.variant"),
    (["advantage.balancer={kind: marble, alpha_ema_decay: 1.0}"], "advantage.balancer.alpha_ema_decay"),
    (["advantage.balancer={kind: mc_grpo, mad_eps: 0}"], "advantage.balancer.mad_eps"),
    (["train.group_size=1"], "train.group_size"),
    (["train.iterations=5", "train.group_size=0"], "train.group_size=0"),
    (["train.lr=-1"], "train.lr"),
    (["train.betas=[1.5, 0.9]"], "train.betas"),
    (["train.weight_decay=-1"], "train.weight_decay"),
    (["train.eps=0"], "train.eps"),
    (["train.max_grad_norm=0"], "train.max_grad_norm"),
    (["train.ema_decay=1.5"], "train.ema_decay"),
    (["train.ema_every=0"], "train.ema_every"),
    (["train.max_skipped=0"], "train.max_skipped"),
    (["train.updates_per_epoch=1", "train.micro_batch=3"], "train.micro_batch"),   # 4 rows per update
    (["run.seed=-1"], "run.seed"),
    (["run.seed=4294967296"], "run.seed"),
    (["run.threads=0"], "run.threads"),
    (["run.name=''"], "run.name"),
    (["run.mixed_precision=fp8"], "run.mixed_precision"),
    (["run.resume=true", "run.restart=true"], "run.restart"),
    (["checkpoint.keep=0"], "checkpoint.keep"),
    (["checkpoint.every=-1"], "checkpoint.every"),
    (["log.every=0"], "log.every"),
    (["sampler.steps=0"], "sampler.steps"),
    (["sampler.eval_steps=0"], "sampler.eval_steps"),
    (["sampler.height=33"], "sampler.height"),
    (["sampler.width=64"], "sampler.width"),
    (["sampler.num_frames=5"], "sampler.num_frames"),
    (["sampler.guidance=-1"], "sampler.guidance"),
    (["objective={kind: grpo}", "sampler.kernel={kind: ode}"], "sampler.kernel.kind"),
    (["objective.adv_clip_max=0"], "objective.adv_clip_max"),
    (["objective.beta=-1"], "objective.beta"),
    (["rewards={}"], "rewards"),
    (["rewards={shapez: 1.0}"], "rewards.shapez"),
    (["policy.tiny=false", "policy.path=/nonexistent/toy"], "policy.path"),
    (["data.train=missing_prompts.txt"], "data.train"),
    (["data.eval=shapes:tset"], "data.eval"),
    (["eval.held_out=[nope]"], "eval.held_out"),
    (["eval.batch=0"], "eval.batch"),
    (["eval.num_prompts=0"], "eval.num_prompts"),
    (["eval.seeds=[]"], "eval.seeds"),
    (["eval.seeds=[-1]"], "eval.seeds"),
    (["eval.every=-1"], "eval.every"),
]


class ModelWouldLoad(BaseException):
    """Raised by the trapped policy loader: the config reached model loading without being refused."""


def load_train_script():
    spec = importlib.util.spec_from_file_location("flowrl_train_script", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def model_loading_trapped():
    """Replace the policy loader (``flowrl.training.parts.build_policy``) by one that raises ModelWouldLoad."""
    import flowrl.training.parts as parts

    def trap(*args, **kwargs):
        raise ModelWouldLoad("the policy would load")

    original, parts.build_policy = parts.build_policy, trap
    try:
        yield
    finally:
        parts.build_policy = original


def check_bad_config(overrides: list[str], key: str, out_dir: str | Path) -> dict:
    """Run ``train.py`` in-process on the tiny toy run plus ``overrides``. Returns {"clear": bool, "line": the
    printed error, "why": what was wrong when not clear}: clear = exit status 1, exactly one line on stderr,
    starting ``config error:`` or ``error:``, naming ``key``, printed before any model load."""
    train, err = load_train_script(), io.StringIO()
    argv = ["--config", str(RECIPE), *TINY, f"run.output_dir={out_dir}", "run.name=bad", *overrides]
    code, why = None, ""
    with model_loading_trapped(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            train.main(argv)
            why = "accepted"
        except ModelWouldLoad:
            why = "reached model loading"
        except SystemExit as e:
            code = e.code
        except Exception as e:  # noqa: BLE001  (an error that is not one line: the finding itself)
            why = f"traceback: {type(e).__name__}: {e}"
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    if not why:
        if code != 1 or len(lines) != 1:
            why = f"exit {code}, {len(lines)} lines"
        elif not line.startswith(("config error:", "error:")) or key not in line:
            why = f"line does not name {key}"
    return {"clear": not why, "line": " ".join(line.split())[:300], "why": why}


def tally_bad_configs(out_dir: str | Path, configs=None) -> dict:
    """``{"clear": n, "tries": m, "unclear": [{overrides, why, line}]}`` over ``configs`` (default all)."""
    configs = BAD_CONFIGS if configs is None else configs
    results = [(ov, check_bad_config(ov, key, Path(out_dir) / f"c{i}")) for i, (ov, key) in enumerate(configs)]
    unclear = [{"overrides": ov, "why": r["why"], "line": r["line"]} for ov, r in results if not r["clear"]]
    return {"clear": len(results) - len(unclear), "tries": len(results), "unclear": unclear}


# ------------------------------------------------------------------------------------- kill -9 and resume

def run_overrides(out_dir: Path, name: str, iterations: int) -> list[str]:
    return ["--config", str(RECIPE), *TINY, f"train.iterations={iterations}", "checkpoint.every=1",
            "checkpoint.keep=2", "run.threads=1", f"run.output_dir={out_dir}", f"run.name={name}"]


def _popen(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(TRAIN), *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def final_state(run_dir: Path) -> tuple[dict, dict]:
    """The latest checkpoint's tensors and state, with the wall-clock counter removed."""
    from flowrl.checkpoint import load_checkpoint

    tensors, state = load_checkpoint(run_dir)
    state["loop"] = {k: v for k, v in state["loop"].items() if k != "wall_time"}
    return tensors, state


def same_state(a, b) -> bool:
    """Bitwise equality of nested tensors / dicts / lists / numbers."""
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b


def reference_run(out_dir: Path, iterations: int, timeout: float = 600) -> float:
    """The uninterrupted run ``out_dir/reference``; returns its wall time in seconds."""
    t0 = time.perf_counter()
    proc = _popen(run_overrides(out_dir, "reference", iterations))
    _, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"reference run failed ({proc.returncode}): {err.decode()[-2000:]}")
    return time.perf_counter() - t0


def kill_resume_try(out_dir: Path, name: str, iterations: int, kills: int, rng: random.Random,
                    timeout: float = 900) -> dict:
    """Train ``out_dir/name``, SIGKILLing it ``kills`` times at random points and resuming after each kill
    (a fresh start when it died before writing config.yaml, as a user would rerun), then to the end.
    {"ok": final checkpoint bitwise equal to the reference's, "kills": kills that hit a live process,
    "resumes", "error"}."""
    run_dir, deadline = out_dir / name, time.monotonic() + timeout
    delivered = resumes = 0

    def start() -> subprocess.Popen:
        nonlocal resumes
        started = (run_dir / "config.yaml").is_file()
        resumes += started
        return _popen(["--resume", str(run_dir)] if started else run_overrides(out_dir, name, iterations))

    def wait(proc: subprocess.Popen) -> tuple[int | None, str]:
        try:
            _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return None, "timeout"
        return proc.returncode, err.decode(errors="replace")[-1000:]

    for _ in range(kills):
        proc = start()
        wait_for_checkpoint(proc, run_dir, rng.randrange(iterations), deadline)
        time.sleep(rng.uniform(0.0, 0.5))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            delivered += 1
        code, err = wait(proc)
        if code not in (0, -signal.SIGKILL):
            return {"ok": False, "kills": delivered, "resumes": resumes, "error": err}
    code, err = wait(start())
    if code != 0:
        return {"ok": False, "kills": delivered, "resumes": resumes, "error": err}
    ok = same_state(final_state(out_dir / "reference"), final_state(run_dir))
    return {"ok": ok, "kills": delivered, "resumes": resumes, "error": "" if ok else "final state differs"}


def wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path, step: int, deadline: float) -> None:
    """Until the run has a checkpoint at ``step`` or later (0: return at once), or the process has exited."""
    from flowrl.checkpoint import list_checkpoints

    while step and proc.poll() is None and time.monotonic() < deadline:
        found = list_checkpoints(run_dir)
        if found and found[-1][0] >= step:
            return
        time.sleep(0.02)


def tally_kill_resume(out_dir: str | Path, tries: int, iterations: int = 8, kills: int = 2, seed: int = 0) -> dict:
    """``{"ok": n, "tries": m, "kills": total, "failures": [...], "reference_s": wall}``."""
    out_dir, rng = Path(out_dir), random.Random(seed)
    wall = reference_run(out_dir, iterations)
    results = [kill_resume_try(out_dir, f"try{i}", iterations, kills, rng) for i in range(tries)]
    return {"ok": sum(r["ok"] for r in results), "tries": tries, "kills": sum(r["kills"] for r in results),
            "failures": [r for r in results if not r["ok"]], "reference_s": round(wall, 1)}
