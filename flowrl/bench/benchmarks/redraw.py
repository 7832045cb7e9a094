"""Redraw, with matplotlib, the committed figures whose data the committed results hold: no training.

    python scripts/bench.py redraw [--results docs/benchmarks] [--out DIR] [--quick]

- ``learning_strict.png`` / ``learning_partial.png`` from ``learning.json``: each method's mean ± SE curve
  against rollout NFEs (the ``curve`` / ``curve_partial`` rows ``[rollout_nfe, mean, se]``), as
  ``scripts/bench.py learning --plot`` draws them;
- ``balancers_<set>.png`` from ``balancers.json``: each conflict set's reward-space scatter (its stored summary),
  as ``scripts/bench.py balancers`` draws it;
- ``hacking_<base>_front.png`` and ``hacking_<base>_palette.png`` from ``hacking.json``'s per-method summaries
  (``hacking_figures.draw`` as the hacking benchmark calls it; a palette figure only where the unguarded run's
  curve is stored).

The pools and trees figures need the runs' per-iteration records, which their JSON does not keep, and the hacking
galleries need the runs' evaluation grids; they are redrawn when their benchmark runs. ``--out`` (default: the
results folder) takes the PNGs; ``--quick`` draws into a temporary folder, to check the script. The last line
printed is the JSON result.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from flowrl.bench import learning_lib
from flowrl.bench.paths import REPO, rel


def learning_aggregates(methods: dict, metric: str) -> dict:
    """``plot_curves`` input rebuilt from the compact curves of ``learning.json``'s methods."""
    key = "curve" if metric == "strict" else f"curve_{metric}"
    return {name: {"curve": [{"rollout_nfe_mean": x, f"{metric}_mean": m, f"{metric}_se": se}
                             for x, m, se in row[key]]}
            for name, row in methods.items() if row.get(key)}


def redraw_learning(results: Path, out: Path) -> list[str]:
    methods = json.loads((results / "learning.json").read_text())["methods"]
    return [rel(learning_lib.plot_curves(learning_aggregates(methods, m), out / f"learning_{m}.png", metric=m))
            for m in ("strict", "partial")]


def redraw_balancers(results: Path, out: Path) -> list[str]:
    sets = json.loads((results / "balancers.json").read_text())["sets"]
    return [rel(learning_lib.plot_reward_space(summary, out / f"balancers_{name}.png"))
            for name, summary in sets.items()]


def sweep_betas(base: str, methods: dict) -> dict[str, float]:
    """{method: β_KL} of the KL-β sweep ``hacking.json`` holds for ``base``: none (0), kl (the recipe's), kl=<β>."""
    from flowrl.bench.benchmarks.hacking import kl_front

    names = [m.split("/", 1)[1] for m in methods if m.startswith(f"{base}/")]
    front = kl_front(base, argparse.Namespace(sweep_size={base: 0}))
    front.update({m: float(m.split("=", 1)[1]) for m in names if m.startswith("kl=")})
    return {m: beta for m, beta in front.items() if m in names}


def redraw_hacking(results: Path, out: Path) -> list[str]:
    from flowrl.bench import hacking_figures

    data = json.loads((results / "hacking.json").read_text())
    methods = data["methods"]
    bases = sorted({k.split("/", 1)[0] for k in methods})
    fronts = {b: sweep_betas(b, methods) for b in bases}
    guards = {b: [g.split("/", 1)[1] for g in data["guards"] if g.startswith(f"{b}/") and g in methods]
              for b in bases}
    drawn = hacking_figures.draw(learning_lib, out, methods, {}, fronts, guards, {}, cols=3)
    errors = {k: v for k, v in drawn.items() if k.endswith("_error")}
    if errors:
        raise RuntimeError(f"redraw hacking: {errors}")
    return [str(v) for v in drawn.values()]


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="bench.py redraw", description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=str(REPO / "docs/benchmarks"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    results = Path(args.results)
    out = Path(tempfile.mkdtemp(prefix="redraw_")) if args.quick else Path(args.out or results)
    return {"bench": "redraw", "quick": args.quick,
            "plots": redraw_learning(results, out) + redraw_balancers(results, out) + redraw_hacking(results, out)}
