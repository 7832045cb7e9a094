"""Pools benchmark (issue #14 item 5): does a cheap-scout candidate pool keep what
naive candidate scaling buys, at a fraction of its rollout NFEs?

    python scripts/bench.py pools [--seeds 0,1,2] [--iterations 40] [--steps 8] [--scout-fraction 0.4] [--quick]

Three DiffusionNFT runs per training seed on the shipped toy model, the same number of iterations, through the
learning-benchmark library (``learning_lib``: held-out strict accuracy, partial credit, palette distance
and seed diversity, mean ± SE over seeds):

- ``pool``:  ``configs/toy/pools/pool_nft.yaml`` — 32 candidates per prompt scored on x̂0 after 3 of 8 steps,
  best-worst 8 kept and resumed (160 rollout forwards per prompt);
- ``plain``: ``configs/toy/nft.yaml`` with 8 samples per prompt (64 per prompt);
- ``naive``: ``configs/toy/pools/naive_nft.yaml`` — 32 full rollouts per prompt, best-worst 8 (256 per
  prompt).

``pool_nfe_ratio`` = pool's rollout NFEs ÷ naive's (target ≤ 0.6; the 8-step arithmetic gives 0.625),
``pool_strict_gap`` = naive's final mean strict − pool's (target ≤ 0.01), ``pool_minus_plain_strict`` = pool's
final mean strict − plain's at equal iterations (target ≥ 0). Each method's mean per-iteration ``pool/*``
metrics (scout↔regenerated Kendall τ over the kept set, hit rates, kept spread, scout share of the NFEs) are
read from its metrics.jsonl when the loop logs the rollout stage's metrics.

``--steps`` sets every method's rollout and evaluation steps; ``--scout-fraction`` the pool's x̂0 exit (k =
round(fraction·steps) calls; 0.25 of 8 exits after 2 calls: 32·3 + 8·5 = 136 forwards per prompt, 0.53× naive).
The last line printed is the JSON result; ``--quick`` (one seed, 2 iterations, 2 prompts per iteration, 4 eval
prompts) checks the script end to end in about two minutes, its figures are not results.
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path

from flowrl.bench import learning_lib
from flowrl.bench.paths import REPO, rel

METHODS = {  # name: (recipe, overrides)
    "pool": (REPO / "configs/toy/pools/pool_nft.yaml", []),
    "plain": (REPO / "configs/toy/nft.yaml", ["train.group_size=8"]),
    "naive": (REPO / "configs/toy/pools/naive_nft.yaml", []),
}


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench.py pools", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2", help="training seeds")
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--evals", type=int, default=4, help="evaluations per run besides 'before'")
    ap.add_argument("--eval-seeds", default="0,1,2")
    ap.add_argument("--eval-prompts", type=int, default=0, help="held-out prompts per evaluation (0: all)")
    ap.add_argument("--prompts-per-iter", type=int, default=0, help="override every recipe's (0: keep)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--steps", type=int, default=0, help="rollout and evaluation steps of every method (0: keep)")
    ap.add_argument("--scout-fraction", type=float, default=0.0, help="the pool's x0-exit fraction (0: keep)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(REPO / "runs" / "bench_pools"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes, end-to-end check only")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.iterations, args.evals, args.eval_seeds = "0", 2, 1, "0,1"
        args.eval_prompts, args.prompts_per_iter = 4, 2
    return args


@contextmanager
def rollout_stage_gets_rewards():
    """The pool's scout scores with the run's reward set, which the trainer hands the rollout stage as
    ``RolloutStage(..., rewards=parts.rewards)``; for a trainer that does not (yet), attach it after
    construction."""
    from flowrl.training import trainer as T

    original = T.Trainer.__init__

    def init(self, *a, **k):
        original(self, *a, **k)
        if getattr(self.rollout, "rewards", None) is None:
            self.rollout.rewards = self.parts.rewards

    T.Trainer.__init__ = init
    try:
        yield
    finally:
        T.Trainer.__init__ = original


def pool_metrics(run_dir: str) -> dict:
    """Mean of every logged ``pool/*`` metric over the run's iterations (empty when none was logged)."""
    path = Path(run_dir) / "metrics.jsonl"
    sums: dict = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        for k, v in json.loads(line).items():
            if k.startswith("pool/") and isinstance(v, (int, float)) and v == v:
                sums.setdefault(k, []).append(float(v))
    return {k: sum(v) / len(v) for k, v in sums.items()}


def main(argv: list[str]) -> dict:
    import torch

    args = parse(argv)
    torch.set_num_threads(args.threads)
    L = learning_lib
    seeds = [int(s) for s in args.seeds.split(",")]
    extra = [f"run.threads={args.threads}"]
    if args.prompts_per_iter:      # micro-batches of 8 divide any whole number of 8-sample groups
        extra += [f"train.prompts_per_iter={args.prompts_per_iter}", "train.micro_batch=8"]
    extra += L.steps_overrides(args.steps)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    aggs = {}
    res = {"bench": "pools", "quick": args.quick, "seeds": seeds, "iterations": args.iterations,
           "steps": args.steps or None, "scout_fraction": args.scout_fraction or None, "methods": {}}
    with rollout_stage_gets_rewards():
        for name in methods:
            recipe, ov = METHODS[name]
            if name == "pool" and args.scout_fraction:
                ov = [*ov, f"sampler.pool.scout.fraction={args.scout_fraction}"]
            runs = [L.run_recipe(recipe, seed=s, iterations=args.iterations,
                                 eval_every=max(1, args.iterations // args.evals),
                                 eval_seeds=[int(v) for v in args.eval_seeds.split(",")],
                                 out_dir=Path(args.out), name=f"{name}_s{s}", overrides=[*ov, *extra],
                                 eval_prompts=args.eval_prompts or None) for s in seeds]
            aggs[name] = agg = L.aggregate(runs)
            after = agg["after"]
            per_run = [pool_metrics(r["run_dir"]) for r in runs]
            keys = sorted({k for m in per_run for k in m})
            res["methods"][name] = {
                **{k: after.get(k) for k in ("rollout_nfe_mean", "train_nfe_mean", "wall_s_mean",
                                              "strict_mean", "strict_se", "partial_mean", "partial_se",
                                              "palette_mean", "diversity_mean")},
                "pool_metrics": {k: sum(m.get(k, 0.0) for m in per_run) / len(per_run) for k in keys}}
    m = res["methods"]
    if {"pool", "naive"} <= set(m):
        res["pool_nfe_ratio"] = _div(m["pool"]["rollout_nfe_mean"], m["naive"]["rollout_nfe_mean"])
        res["pool_strict_gap"] = _sub(m["naive"]["strict_mean"], m["pool"]["strict_mean"])
    if {"pool", "plain"} <= set(m):
        res["pool_minus_plain_strict"] = _sub(m["pool"]["strict_mean"], m["plain"]["strict_mean"])
    res["targets"] = {"pool_nfe_ratio": "<= 0.6", "pool_strict_gap": "<= 0.01",
                      "pool_minus_plain_strict": ">= 0"}
    try:
        res["plot"] = rel(L.plot_curves(aggs, Path(args.out) / "pools_strict.png", metric="strict"))
    except Exception as e:          # a plot is a convenience; the figures above are the result
        res["plot_error"] = repr(e)
    return res


def _sub(a, b):
    return None if a is None or b is None else a - b


def _div(a, b):
    return None if a is None or not b else a / b


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
