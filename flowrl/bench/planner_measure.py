"""The memory planner against measured CPU peaks: the toy and a tiny SD3, one short training iteration, on one and
two processes (``torchrun``, FSDP), each in a fresh subprocess (docs/memory.md "Validation").

    from flowrl.bench.planner_measure import measure
    measure(quick=False)   # {"planner_max_rel_error": …, "cases": [{case, gpus, predicted, measured, rel_error}]}

Measured: torch's CPU allocations (``flowrl.planning.counter.peak_allocated``: profiler memory events) from
before the Trainer is built to the end of iteration 0 (rollout, reward, update, old-weights step), the peak over
the processes — the CPU counterpart of ``torch.cuda.max_memory_allocated``, the figure the planner predicts. The
process RSS high-water mark above the RSS before building (``VmHWM − VmRSS``) is reported beside it, not compared:
it also holds the code pages of libtorch touched on first use and allocator slack, which dominate at these sizes.
rel_error = |predicted − measured| / measured. ``quick``: the 1-process cases only.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from flowrl.bench.paths import REPO

ONE_ITERATION = ["train.iterations=1", "eval.before=false", "eval.after=false", "log.progress=false",
                 "run.cpu=true", "checkpoint.every=0"]
CASES = {
    "toy": ("configs/toy/grpo.yaml", []),
    "tiny_sd3": ("configs/sd35/grpo_pickscore.yaml",
                 ["policy.tiny=true", "policy.dtype=float32", "run.mixed_precision='no'", "sampler.height=32",
                  "sampler.width=32", "sampler.steps=4", "sampler.chunk=4", "train.prompts_per_iter=4",
                  "train.group_size=4", "train.micro_batch=4", "rewards={jpeg_compressibility: 1.0}",
                  "train.ema_decay=0.9"]),
}


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field (VmRSS, VmHWM) in KiB (0 where there is no /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def worker(out: str, config: str, overrides: list[str]) -> None:
    """Build the Trainer and run iteration 0 under the allocation counter; write this rank's figures to ``out``."""
    import torch

    from flowrl.config import load_config
    from flowrl.planning.counter import peak_allocated

    cfg = load_config(config, overrides)
    rss0 = status_kib("VmRSS")
    torch.set_num_threads(1)

    def build():
        from flowrl.training.trainer import Trainer

        return Trainer(cfg)

    trainer, build_peak, held = peak_allocated(build)
    _, iteration_peak, _ = peak_allocated(lambda: trainer.iteration(0))
    rank = int(os.environ.get("RANK", "0"))
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(
        {"peak_allocated": max(build_peak, held + iteration_peak), "build_peak": build_peak, "held_after_build": held,
         "iteration_peak_above_held": iteration_peak, "rss_above_start": (status_kib("VmHWM") - rss0) * 1024,
         "world": trainer.dist.world}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(case: str, gpus: int, tmp: Path) -> dict:
    """Run the worker for ``case`` on ``gpus`` processes; the peak over the ranks."""
    config, extra = CASES[case]
    overrides = [*extra, *ONE_ITERATION, f"run.output_dir={tmp}", f"run.name={case}_{gpus}",
                 *(["dist.fsdp=true"] if gpus > 1 else [])]
    out = tmp / f"{case}_{gpus}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    if Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    head = [sys.executable] if gpus == 1 else [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                                              str(gpus), "--master_addr", "127.0.0.1",
                                              "--master_port", str(free_port())]
    cmd = [*head, "-m", "flowrl.bench.planner_measure", str(out), config, *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"{case} on {gpus} process(es) failed:\n" + (proc.stdout + proc.stderr)[-3000:])
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(gpus)]
    return {"measured": max(r["peak_allocated"] for r in ranks),
            "rss_above_start": max(r["rss_above_start"] for r in ranks), "overrides": overrides}


def predicted(case: str, gpus: int, overrides: list[str]) -> dict:
    from flowrl.config import load_config
    from flowrl.planning import plan

    p = plan(load_config(CASES[case][0], overrides), gpus, 80.0, remedies=False)
    return {"predicted": p.peak, "items": p.items, "phases": p.phases}


def measure(quick: bool = False) -> dict:
    """Predicted vs measured peak per case (module docstring); ``planner_max_rel_error`` over the cases."""
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            for gpus in (1,) if quick else (1, 2):
                m = launch(case, gpus, Path(tmp))
                p = predicted(case, gpus, m.pop("overrides"))
                rel = abs(p["predicted"] - m["measured"]) / m["measured"]
                cases.append({"case": case, "gpus": gpus, "predicted_bytes": p["predicted"],
                              "measured_bytes": m["measured"], "rel_error": round(rel, 4),
                              "rss_above_start_bytes": m["rss_above_start"], "predicted_items": p["items"],
                              "predicted_phases": p["phases"]})
    return {"planner_max_rel_error": max(c["rel_error"] for c in cases),
            "method": "torch CPU allocation peak (profiler memory events), max over processes",
            "cases": cases}


RECIPE_DIRS = ("configs/sd35", "configs/flux", "configs/wan21", "configs/toy", "configs/wan22", "configs/hunyuan15",
               "configs/ltx2")


def recipe_table(gpu_mem: float = 80.0) -> str:
    """Markdown rows: every shipped recipe's predicted peak per process on 1 GPU, 8 GPUs as written and 8 GPUs
    with ``dist.fsdp=true``, and the first single change that fits where it does not (docs/memory.md)."""
    from flowrl.config import check_geometry, load_config
    from flowrl.planning import plan

    rows = ["| recipe | model | 1 GPU | 8 GPUs | 8 GPUs + FSDP | change first (1 GPU) |", "|---|---|---|---|---|---|"]
    for path in sorted(p for d in RECIPE_DIRS for p in (REPO / d).rglob("*.yaml")):
        cells = []
        for gpus, extra in ((1, []), (8, []), (8, ["dist.fsdp=true"])):
            cfg = load_config(path, extra)
            try:
                check_geometry(cfg, gpus)
            except Exception as err:                       # the recipe's batch does not split over 8
                cells.append(("n/a: " + str(err).split(";")[0], None))
                continue
            p = plan(cfg, gpus, gpu_mem, remedies=gpus == 1)
            size = f"{p.peak / 2**30:.1f} GiB" if p.peak >= 2**30 else f"{p.peak / 2**20:.0f} MiB"
            cells.append((f"{size} {'fits' if p.fits else '**does not fit**'}", p))
        one = cells[0][1]
        first = next((r["change"] for r in one.remedies if r.get("fits")), "combine changes") if not one.fits else ""
        figures = " | ".join(c for c, _ in cells)
        rows.append(f"| `{path.relative_to(REPO)}` | {one.model} | {figures} | {first} |")
    return "\n".join(rows)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--table":
        print(recipe_table())
    elif len(sys.argv) > 1 and sys.argv[1] == "--quick":
        print(json.dumps(measure(quick=True)))
    elif len(sys.argv) > 2:
        worker(sys.argv[1], sys.argv[2], sys.argv[3:])
    else:
        print(json.dumps(measure()))
