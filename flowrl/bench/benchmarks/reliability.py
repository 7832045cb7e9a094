"""Reliability benchmark (issue #16): how often each injected fault ends the way docs/training.md "Faults" says.

    python scripts/bench.py reliability [--tries 10 --kills 3 --iterations 8] [--quick]

- ``kill_resume`` [ok, tries]: a tiny toy run (CPU, one thread, a checkpoint every iteration) is SIGKILLed
  ``--kills`` times at random points — during start-up, mid-iteration, mid-save — and resumed with
  ``scripts/train.py --resume`` after each kill; ok when its final checkpoint (adapters, EMA, optimizer state,
  loop counters) is bitwise equal to an uninterrupted run's (``faults.kill_resume_try``). ``kills`` counts
  the kills that hit a live process.
- ``bad_configs`` [clear, tries]: every mistake in ``faults.BAD_CONFIGS`` (negative eps, group_size 1, bad
  resolution, GRPO with an ODE kernel, missing files, …) run through train.py's ``main``; clear when it exits
  1 with exactly one line naming the key, before the policy loads (``unclear`` lists any that are not).
- ``server_load`` [served, sent]: ``server_load.run_server_load`` — valid reward-server requests answered
  while half-open, stalled and malformed peers hold the server (``server_faults`` of them).

The last line printed is the JSON result. ``--quick`` (one kill-and-resume try with 2 kills, 10 connections ×
1 round) checks the script end to end in about a minute; its tallies are not results.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from flowrl.bench import faults, server_load


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench.py reliability", description=__doc__.split("\n")[0])
    ap.add_argument("--tries", type=int, default=10, help="kill-and-resume runs")
    ap.add_argument("--kills", type=int, default=3, help="SIGKILLs per run before it may finish")
    ap.add_argument("--iterations", type=int, default=8, help="iterations of each tiny run")
    ap.add_argument("--connections", type=int, default=50, help="reward-server clients per round")
    ap.add_argument("--rounds", type=int, default=5, help="reward-server rounds")
    ap.add_argument("--seed", type=int, default=0, help="seeds the kill points")
    ap.add_argument("--out", default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--quick", action="store_true", help="end-to-end check of the script (~1 min)")
    args = ap.parse_args(argv)
    if args.quick:
        args.tries, args.kills, args.connections, args.rounds = 1, 2, 10, 1
    return args


def main(argv: list[str]) -> dict:
    args = parse(argv)
    seconds = {}
    with tempfile.TemporaryDirectory(prefix="flowrl-reliability-") as tmp:
        out = Path(args.out or tmp)
        t0 = time.perf_counter()
        bad = faults.tally_bad_configs(out / "bad_configs")
        seconds["bad_configs"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        kr = faults.tally_kill_resume(out / "kill_resume", args.tries, args.iterations, args.kills, args.seed)
        seconds["kill_resume"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    load = server_load.run_server_load(connections=args.connections, rounds=args.rounds)
    seconds["server_load"] = time.perf_counter() - t0
    return {"bench": "reliability", "quick": args.quick,
            "kill_resume": [kr["ok"], kr["tries"]], "kills": kr["kills"], "kill_failures": kr["failures"],
            "bad_configs": [bad["clear"], bad["tries"]], "unclear": bad["unclear"],
            "server_load": [load["served"], load["sent"]], "server_faults": load["faults"],
            "server_resets": load["resets"], "server_refused": load["refused"],
            "settings": {"tries": args.tries, "kills": args.kills, "iterations": args.iterations,
                         "connections": args.connections, "rounds": args.rounds, "seed": args.seed},
            "seconds": {k: round(v, 1) for k, v in seconds.items()}}
