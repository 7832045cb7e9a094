"""Cluster-operation benchmark: what a preempted, restarted or resharded job keeps (the cluster-operation issue).

    python scripts/bench.py cluster [--parts sigterm,dcp,planner] [--tries 10 --iterations 16 --seed 0] [--quick]

- ``sigterm`` [``sigterm_ok``, ``sigterm_tries``]: a tiny toy run (CPU, one thread, ``checkpoint.every=0``: no
  periodic checkpoint to fall back on) is started as a job array would, ``scripts/train.py --resume auto ...``,
  and sent SIGTERM at a random time (seeded), uniform between the run directory opening (the handlers are in
  place) and the moment the uninterrupted reference run wrote its final checkpoint. A trial is ok when the run
  exits 0 printing ``preempted at iteration N: checkpoint …``, that checkpoint is its newest and is at N, and
  rerunning the same command exits 0 with a final checkpoint (adapters, EMA, optimizer, counters) bitwise equal
  to the reference's. A signal that comes after the run ended (final checkpoint written, the process exiting)
  is ignored and the run exits 0 (``after_end``). ``sigterm_ok`` is true iff every trial is ok.

- ``dcp`` [``dcp_save_peak_ratio``, ``dcp_resume_bitwise``]: ``flowrl.bench.dcp_measure`` — 2 CPU processes
  under FSDP, the resident-set high-water mark over one save with DCP vs the full-gather path (the larger
  process of each), and a DCP checkpoint resumed on 2 processes (bitwise the uninterrupted run) and on 1
  (bitwise the same resume from the full-gather checkpoint).

- ``planner`` [``planner_max_rel_error``]: ``flowrl.bench.planner_measure`` — ``scripts/plan.py``'s predicted
  per-process peak against the measured peak of torch's CPU allocations over one training iteration (toy and
  tiny SD3, 1 and 2 processes), the largest relative error.

Parts are independent; each adds its own keys (``--parts`` picks them). The last line printed is the JSON result.
``--quick`` (2 trials of 4 iterations) checks the script end to end; its tallies are not results.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flowrl.bench import faults

LINE = re.compile(r"preempted at iteration (\d+): checkpoint (\S+);")


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench.py cluster", description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="sigterm,dcp,planner", help=f"comma-separated parts of {sorted(PARTS)}")
    ap.add_argument("--tries", type=int, default=10, help="SIGTERM trials")
    ap.add_argument("--iterations", type=int, default=16, help="iterations of each tiny run")
    ap.add_argument("--seed", type=int, default=0, help="seeds the signal times")
    ap.add_argument("--out", default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--quick", action="store_true", help="end-to-end check of the script")
    args = ap.parse_args(argv)
    if args.quick:
        args.tries, args.iterations = 2, 4
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        ap.error(f"--parts: unknown {unknown}; choose from {sorted(PARTS)}")
    return args


def command(out_dir: Path, name: str, iterations: int) -> list[str]:
    """One command line for every try: ``train.py --resume auto`` on the tiny run, no periodic checkpoint."""
    return [sys.executable, str(faults.TRAIN), "--resume", "auto",
            *faults.run_overrides(out_dir, name, iterations), "checkpoint.every=0"]


def start(cmd: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=faults.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int | None, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, "timeout"
    return proc.returncode, out + err


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> float:
    """Until ``path`` exists (or the process ended); the time.monotonic() it was seen."""
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return time.monotonic()


def reference(out_dir: Path, iterations: int) -> float:
    """The uninterrupted run; seconds from its run directory opening to its final checkpoint."""
    run_dir = out_dir / "reference"
    proc = start(command(out_dir, "reference", iterations))
    opened = wait_for(run_dir / "config.yaml", proc)
    final = wait_for(run_dir / "checkpoints" / f"step_{iterations:08d}", proc)
    code, printed = finish(proc)
    if code != 0:
        raise RuntimeError(f"reference run failed ({code}): {printed[-2000:]}")
    return final - opened


def sigterm_trial(out_dir: Path, name: str, iterations: int, delay: float) -> dict:
    """One SIGTERM ``delay`` s after the run directory opens, then the same command again."""
    from flowrl.checkpoint import list_checkpoints

    run_dir, cmd = out_dir / name, command(out_dir, name, iterations)
    proc = start(cmd)
    wait_for(run_dir / "config.yaml", proc)
    time.sleep(delay)
    delivered = proc.poll() is None
    if delivered:
        os.kill(proc.pid, signal.SIGTERM)
    code, printed = finish(proc)
    found = LINE.search(printed)
    ckpts = list_checkpoints(run_dir)
    trial = {"delay_s": round(delay, 3), "delivered": delivered, "exit": code,
             "stopped_at": int(found.group(1)) if found else None,
             "checkpoint": Path(found.group(2)).name if found else None,
             "newest": ckpts[-1][0] if ckpts else None}
    trial["after_end"] = not found and trial["newest"] == iterations    # the run was over when it came
    errors = []
    if code != 0:
        errors.append(f"exit {code}: {printed[-600:]}")
    if not found and not trial["after_end"]:
        errors.append("no 'preempted at iteration' line and the run did not end")
    if found and (trial["newest"] != trial["stopped_at"] or Path(found.group(2)) != ckpts[-1][1]):
        errors.append(f"newest checkpoint {trial['newest']} is not the printed one")
    code, printed = finish(start(cmd))
    trial["resume_exit"] = code
    trial["bitwise"] = code == 0 and faults.same_state(faults.final_state(out_dir / "reference"),
                                                       faults.final_state(run_dir))
    if not trial["bitwise"]:
        errors.append(f"resume exit {code}" if code else "final state differs from the reference")
    trial["ok"] = not errors
    trial["error"] = "; ".join(errors)[-800:]
    return trial


def sigterm_part(out_dir: Path, args: argparse.Namespace) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    window = reference(out_dir, args.iterations)
    rng = random.Random(args.seed)
    trials = [sigterm_trial(out_dir, f"try{i}", args.iterations, rng.uniform(0.0, window))
              for i in range(args.tries)]
    return {"sigterm_ok": all(t["ok"] for t in trials), "sigterm_tries": len(trials),
            "sigterm_preempted": sum(t["stopped_at"] is not None for t in trials),
            "sigterm_after_end": sum(t["after_end"] for t in trials),
            "sigterm_window_s": round(window, 2), "sigterm_trials": trials}


def dcp_part(out_dir: Path, args: argparse.Namespace) -> dict:
    """Sharded (DCP) checkpoints on 2 CPU processes: the save's peak bytes per process against the full-gather
    path, and bitwise resume on 2 and on 1 process (``flowrl.bench.dcp_measure``, which says how)."""
    from flowrl.bench import dcp_measure

    return dcp_measure.measure_detail(args.quick, out_dir)


def planner_part(out_dir: Path, args: argparse.Namespace) -> dict:
    """The memory planner's predicted peak against the measured CPU peak of one training iteration, toy and
    tiny SD3 on 1 and 2 processes (``flowrl.bench.planner_measure``, which says how)."""
    from flowrl.bench import planner_measure

    return planner_measure.measure(args.quick)


PARTS = {"sigterm": sigterm_part, "dcp": dcp_part, "planner": planner_part}


def main(argv: list[str]) -> dict:
    args = parse(argv)
    result, seconds = {"bench": "cluster", "quick": args.quick, "parts": args.parts}, {}
    with tempfile.TemporaryDirectory(prefix="flowrl-cluster-") as tmp:
        out = Path(args.out or tmp)
        for part in args.parts:
            t0 = time.perf_counter()
            result.update(PARTS[part](out / part, args))
            seconds[part] = round(time.perf_counter() - t0, 1)
    result["settings"] = {"tries": args.tries, "iterations": args.iterations, "seed": args.seed}
    result["seconds"] = seconds
    return result
