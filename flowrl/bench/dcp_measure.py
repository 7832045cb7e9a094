"""Sharded (DCP) checkpoints vs the full-gather path on 2 CPU processes under FSDP: peak memory while saving, and
bitwise resume on 2 and on 1 process (cluster-operation issue, item 1; ``flowrl.checkpoint.sharded``).

Memory (``dcp_save_peak_ratio``): one fresh 2-process torchrun per path, each building the same full fine-tune
of the toy transformer (the shipped 9.5M-parameter one in float32, ``quick``: the tiny preset) with its AdamW
state made by one zero-gradient step, then saving once with ``save_run(layout=...)``. Torch's CPU tensors are
invisible to ``tracemalloc``, so the figure is the resident set: the kernel's high-water mark (``VmHWM``) is
reset (``/proc/self/clear_refs`` ← 5) right before the save and read right after it; the save's peak is
``VmHWM − VmRSS`` before it. glibc's mmap threshold is pinned (``MALLOC_MMAP_THRESHOLD_``) so freed tensor
memory goes back to the kernel instead of being reused unseen. Weights dominate: the saved tensors (train, old,
EMA, two AdamW moments) are 5× the transformer's 38 MB, far above anything else a save allocates. The ratio is
the larger process's DCP peak over the larger process's full-gather peak (the main process: it holds every
gathered tensor and writes them).

Resume (``dcp_resume_bitwise``): a 2-iteration GRPO LoRA run on 2 processes saving DCP checkpoints, its twin
saving full-gather ones (same run, so the same states), then iteration 1's DCP checkpoint resumed on 2 processes
("2": ends bitwise where the uninterrupted run ends) and on 1 ("1": ends bitwise where the 1-process resume of the
twin's full-gather checkpoint ends, and the DCP checkpoint read whole equals the twin's bit for bit).

    python -m flowrl.bench.dcp_measure [--quick]      # prints the result as JSON
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from flowrl.bench.paths import REPO

RUN = ["policy.kind=toy", "policy.tiny=true", "policy.lora={rank: 2, alpha: 4}", "objective.kind=grpo",
       "sampler.kernel.kind=flow_sde", "sampler.steps=3", "sampler.eval_steps=2", "sampler.height=32",
       "sampler.width=32", "sampler.guidance=1.0", "rewards={jpeg_compressibility: 1.0}", "train.iterations=2",
       "train.prompts_per_iter=2", "train.group_size=2", "train.micro_batch=1", "sampler.chunk=1",
       "train.updates_per_epoch=1", "train.ema_every=1", "eval.before=false", "eval.after=false",
       "eval.num_prompts=2", "eval.seeds=[0]", "eval.every=0", "eval.batch=2", "log.progress=false",
       "checkpoint.every=1", "checkpoint.keep=5", "run.cpu=true", "dist.fsdp=true"]
FULL_FINE_TUNE = ["policy.lora=null", "policy.dtype=float32"]


# ----------------------------------------------------------------------------------------------- launching

def _env() -> dict:
    """One thread a process, no CUDA, gloo on loopback, this checkout first on the path, glibc's mmap threshold
    pinned (freed tensors return to the kernel, so the resident set follows what is held)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "MALLOC_MMAP_THRESHOLD_": "65536",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(*args: str, processes: int = 2, timeout: int = 900) -> None:
    """``python -m flowrl.bench.dcp_measure ARGS`` on ``processes`` processes (torchrun for 2; one retry when the
    processes failed to meet, a port taken between the probe and the bind)."""
    for attempt in range(2):
        cmd = [sys.executable, "-m", "flowrl.bench.dcp_measure", *args]
        if processes > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                   "--master_addr", "127.0.0.1", "--master_port", str(_port()), *cmd[1:]]
        proc = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=timeout)
        printed = proc.stdout + proc.stderr
        if proc.returncode == 0:
            return
        if attempt or not any(s in printed for s in ("EADDRINUSE", "Address already in use", "DistNetworkError")):
            raise RuntimeError(f"{' '.join(args)}: exited {proc.returncode}:\n" + "\n".join(printed.splitlines()[-40:]))


# -------------------------------------------------------------------------------------- in the processes

def _trainer(overrides: list[str], layout: str = "auto"):
    import flowrl.training.trainer as trainer_module
    from flowrl.checkpoint.resume import save_run
    from flowrl.config import load_config, load_resolved

    trainer_module.save_run = functools.partial(save_run, layout=layout)    # the run's own saves, this layout
    if overrides and overrides[0] == "resume":
        cfg = load_resolved(overrides[1], ["run.resume=true", *overrides[2:]])
    else:
        cfg = load_config(None, overrides)
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    return trainer_module.Trainer(cfg)


def _rank() -> int:
    import torch

    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _barrier() -> None:
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker_memory(out: Path, layout: str, quick: bool) -> None:
    """This process's resident-set peak while ``save_run(layout)`` saves a full fine-tune with AdamW state."""
    import gc

    import torch

    from flowrl.checkpoint.resume import save_run

    run = [*RUN, *FULL_FINE_TUNE, f"run.output_dir={out}", f"run.name=mem_{layout}",
           *([] if quick else ["policy.tiny=false"])]
    trainer = _trainer(run, layout)
    params = [p for g in trainer.parts.optimizer.param_groups for p in g["params"]]
    for p in params:                        # AdamW state as after a step, weights unchanged (zero gradients, lr 0)
        p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in trainer.parts.optimizer.param_groups]
    for g in trainer.parts.optimizer.param_groups:
        g["lr"] = 0.0
    trainer.parts.optimizer.step()
    for g, lr in zip(trainer.parts.optimizer.param_groups, lrs):
        g["lr"] = lr
    trainer.parts.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    _barrier()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kb("VmRSS")
    save_run(trainer.cfg.run_dir, trainer.run_state, 1, trainer.dist, layout=layout)
    peak = _status_kb("VmHWM") - before
    result = {"layout": layout, "rank": _rank(), "peak_bytes": peak * 1024, "rss_before_bytes": before * 1024}
    (out / f"mem_{layout}_rank{_rank()}.json").write_text(json.dumps(result))


def _final_state(trainer, path: Path) -> None:
    """The run's final weights, EMA, optimizer and counters, whole, on the main process (a collective)."""
    import torch

    from flowrl.checkpoint.resume import snapshot

    tensors, extra = snapshot(trainer.run_state)
    loop = {k: v for k, v in trainer.state.as_dict().items() if k != "wall_time"}
    if _rank() == 0:
        torch.save({"tensors": tensors, "optimizer": extra["optimizer"], "loop": loop}, path)


def _cut(out: Path, source: str, name: str) -> Path:
    """``out/name``: run ``source`` as a kill right after iteration 1's checkpoint leaves it."""
    from flowrl.checkpoint import list_checkpoints

    dst = out / name
    if _rank() == 0:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(out / source, dst)
        for step, path in list_checkpoints(dst):
            if step > 1:
                shutil.rmtree(path)
    _barrier()
    return dst


def worker_resume(out: Path, processes: int) -> None:
    """2 processes: the DCP run, its full-gather twin, the DCP run resumed from iteration 1; 1 process: both
    resumed from iteration 1 unsharded. Each writes ``out/<case>.pt``."""
    import torch

    torch.set_num_threads(1)
    base = [*RUN, f"run.output_dir={out}"]
    if processes == 2:
        cases = [("dcp", [*base, "run.name=dcp"], "auto"), ("full", [*base, "run.name=full"], "full"),
                 ("dcp_resumed", ["resume", None], "auto")]
    else:
        cases = [("one_from_dcp", ["resume", None, "dist.fsdp=false"], "auto"),
                 ("one_from_full", ["resume", None, "dist.fsdp=false"], "auto")]
    for name, overrides, layout in cases:
        if overrides[0] == "resume":
            overrides[1] = str(_cut(out, {"dcp_resumed": "dcp", "one_from_dcp": "dcp"}.get(name, "full"), name))
        trainer = _trainer(overrides, layout)
        trainer.run()
        _final_state(trainer, out / f"{name}.pt")


# --------------------------------------------------------------------------------------------- comparing

def _bitwise(a: dict, b: dict) -> bool:
    import torch

    def flat(r):
        out = {f"{g}/{k}": v for g, group in r["tensors"].items() for k, v in group.items()}
        out |= {f"opt/{i}/{k}": v for i, s in r["optimizer"]["state"].items() for k, v in s.items()}
        return out

    fa, fb = flat(a), flat(b)
    loops = [{k: v for k, v in r["loop"].items() if k != "wall_time"} for r in (a, b)]
    return (fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa) and loops[0] == loops[1]
            and a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"])


def _whole_checkpoints_equal(out: Path) -> bool:
    """The DCP run's last checkpoint read whole on this process equals its full-gather twin's, bit for bit."""
    from flowrl.checkpoint import latest_checkpoint, load_checkpoint

    (dt, ds), (ft, fs) = (load_checkpoint(latest_checkpoint(out / n)) for n in ("dcp", "full"))
    return _bitwise({"tensors": dt, **{k: ds[k] for k in ("optimizer", "loop")}},
                    {"tensors": ft, **{k: fs[k] for k in ("optimizer", "loop")}})


def measure_detail(quick: bool = False, out: Path | None = None) -> dict:
    """Every figure: per-process peaks of both paths, the ratio, and each resume check."""
    import torch

    tmp = Path(out or tempfile.mkdtemp(prefix="flowrl-dcp-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        peaks = {}
        for layout in ("auto", "full"):
            _launch("memory", str(tmp), layout, *(["--quick"] if quick else []))
            peaks[layout] = [json.loads((tmp / f"mem_{layout}_rank{r}.json").read_text())["peak_bytes"]
                             for r in (0, 1)]
        _launch("resume", str(tmp), "2")
        _launch("resume", str(tmp), "1", processes=1)
        load = functools.partial(torch.load, weights_only=True)
        r = {n: load(tmp / f"{n}.pt") for n in ("dcp", "full", "dcp_resumed", "one_from_dcp", "one_from_full")}
        checks = {"2_resume_equals_uninterrupted": _bitwise(r["dcp_resumed"], r["dcp"]),
                  "format_leaves_training_unchanged": _bitwise(r["dcp"], r["full"]),
                  "1_resume_equals_full_gather_resume": _bitwise(r["one_from_dcp"], r["one_from_full"]),
                  "read_whole_equals_full_gather_checkpoint": _whole_checkpoints_equal(tmp)}
    finally:
        if out is None:
            shutil.rmtree(tmp, ignore_errors=True)
    ratio = max(peaks["auto"]) / max(peaks["full"])
    return {"dcp_save_peak_ratio": round(ratio, 4),
            "dcp_resume_bitwise": {"1": checks["1_resume_equals_full_gather_resume"]
                                   and checks["read_whole_equals_full_gather_checkpoint"],
                                   "2": checks["2_resume_equals_uninterrupted"]},
            "peak_bytes": {"dcp": peaks["auto"], "full_gather": peaks["full"]}, "checks": checks,
            "model": "toy tiny preset" if quick else "toy transformer 9.5M params, float32, full fine-tune",
            "method": "resident-set high-water mark (VmHWM reset via /proc/self/clear_refs) over one save_run, "
                      "fresh 2-process torchrun per path"}


def measure(quick: bool = False) -> dict:
    """``{"dcp_save_peak_ratio": float, "dcp_resume_bitwise": {"1": bool, "2": bool}}`` (module docstring)."""
    detail = measure_detail(quick)
    return {k: detail[k] for k in ("dcp_save_peak_ratio", "dcp_resume_bitwise")}


def main(argv: list[str]) -> None:
    if argv and argv[0] == "memory":
        worker_memory(Path(argv[1]), argv[2], "--quick" in argv)
    elif argv and argv[0] == "resume":
        worker_resume(Path(argv[1]), int(argv[2]))
    else:
        print(json.dumps(measure_detail("--quick" in argv), indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
