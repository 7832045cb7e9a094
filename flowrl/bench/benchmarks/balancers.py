"""Multi-reward balancers vs a swept weighted sum on the toy shapes world (issue #15).

    python scripts/bench.py balancers [--sets specialist,count_vs_ink,position_vs_centering] [--seeds 0,1,2]
                                      [--methods ws,gdpo,marble,pcgrad,famo] [--iterations 60] [--quick]

DiffusionNFT on the shipped toy model with the learning benchmark's budget (60 iterations of 8 prompts × 4
images), one recipe per conflicting reward set (``configs/toy/balancers/<set>.yaml``), every method from the
same checkpoint with the same seeds: a weighted-sum sweep (≥ 5 weight vectors: the learning rate and
everything else untouched, only the weights move) and GDPO, MARBLE (amortized Gram: every 10 iterations, α-EMA
0.7), PCGrad and FAMO at their defaults, untuned. Every run is evaluated before and after on all held-out
prompts × 3 seeds.

Per method (seed means; 95 % t-intervals over seeds): each training reward's held-out gain; its point in
reward space; the hypervolume w.r.t. the base checkpoint HV = Π_k (R_k − R_k^base)₊ (one point per
method); the worst-reward normalised gain min_k (R_k − R_k^base)/(R_k^best − R_k^base), R_k^best the best any
run of the set reached (a stand-in for a run trained on reward k alone); whether a swept weighted sum
dominates it (≥ on every reward, seed means); training wall time (evaluation and conflict diagnostics
excluded); the fraction of diagnosed batches in which some reward's gradient opposes the applied update
(``balance/neg_cos_any``, MARBLE: 80 % under the weighted sum) and the mean applied per-reward weights α. The
specialist set adds the verifier's strict accuracy per skill (``eval/shapes/skill_<skill>/mean``) and its
worst-skill gain.

Headline keys: ``worst_gain_margin`` (specialist: best balancer's worst-skill strict gain − best sweep
point's; T-C1 asks ≥ 0.03), ``<set>/dominated`` / ``<set>/hv`` per balancer and ``<set>/hv_sweep_median`` for
the conflict sets (T-C2: not dominated, HV ≥ the sweep median), ``marble_cost_ratio`` (MARBLE's training time
/ the equal-weight weighted sum's, same runs; target ≤ 1.05). ``--quick`` checks the script end to end in
minutes (1 iteration, one seed, two sweep points, a few prompts): its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

from flowrl.bench import learning_lib
from flowrl.bench.paths import REPO, rel

RECIPES = REPO / "configs" / "toy" / "balancers"
SETS = {   # set → (training rewards, weighted-sum sweep; the recipe's own weights are the first point)
    "specialist": (("shapes_count_only", "shapes_position_only", "shapes_color_only"),
                   ((1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (1, 2, 2), (2, 1, 2), (2, 2, 1))),
    "count_vs_ink": (("shapes_count_only", "shapes_ink_budget"),
                     ((0.5, 0.5), (0.1, 0.9), (0.25, 0.75), (0.75, 0.25), (0.9, 0.1))),
    "position_vs_centering": (("shapes_position_only", "shapes_centering"),
                              ((0.5, 0.5), (0.1, 0.9), (0.25, 0.75), (0.75, 0.25), (0.9, 0.1))),
}
BALANCERS = {"gdpo": "{kind: gdpo}", "marble": "{kind: marble, solve_every: 10, alpha_ema_decay: 0.7}",
             "pcgrad": "{kind: pcgrad}", "famo": "{kind: famo}"}
SKILLS = ("color", "counting", "position", "relation", "binding")
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def parse(argv):
    ap = argparse.ArgumentParser(prog="bench.py balancers", description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--seeds", default="0,1,2", help="training seeds (run.seed), one run per method each")
    ap.add_argument("--methods", default="ws," + ",".join(BALANCERS), help="ws = the weighted-sum sweep")
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--eval-seeds", default="0,1,2", help="evaluation seeds (images per held-out prompt)")
    ap.add_argument("--diagnose-every", type=int, default=3, help="iterations between conflict diagnostics")
    ap.add_argument("--out", default=str(REPO / "runs" / "bench_balancers"))
    ap.add_argument("--quick", action="store_true", help="end-to-end check: 1 iteration, 1 seed, tiny eval")
    return ap.parse_args(argv)


# ------------------------------------------------------------------------------------------- statistics
def mean_ci(xs: list[float]) -> dict:
    """{"mean", "ci95": half-width of the t-interval over seeds (null with one seed)}."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return {"mean": None, "ci95": None}
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return {"mean": m, "ci95": None}
    return {"mean": m, "ci95": T975.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))}


def hypervolume(point: list[float], ref: list[float]) -> float:
    """HV of one point w.r.t. ``ref`` (maximisation): Π_k (p_k − r_k)₊."""
    return math.prod(max(p - r, 0.0) for p, r in zip(point, ref))


def dominates(q: list[float], p: list[float]) -> bool:
    """q ≥ p on every reward and > on one."""
    return all(a >= b for a, b in zip(q, p)) and any(a > b for a, b in zip(q, p))


# ---------------------------------------------------------------------------------------------- runs
def diagnose_overrides(every: int) -> list[str]:
    """``advantage.diagnose_every`` when the schema has it (the advantage stage's conflict diagnostics)."""
    from flowrl.config.schema import AdvantageSection

    has = any(f.name == "diagnose_every" for f in dataclasses.fields(AdvantageSection))
    return [f"advantage.diagnose_every={every}"] if has and every > 0 else []


def method_overrides(set_name: str, method: str) -> list[str]:
    """``ws<i>`` → the i-th sweep weights; a balancer name → its whole-mapping override."""
    rewards, sweep = SETS[set_name]
    if method.startswith("ws"):
        return [f"rewards.{r}.weight={w}" for r, w in zip(rewards, sweep[int(method[2:])])]
    return [f"advantage.balancer={BALANCERS[method]}"]


def run_log(run_dir: Path) -> dict:
    """Training time without diagnostics, the diagnosed conflict fraction and mean α, from metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    train = [r for r in recs if "adv/mean" in r]
    wall = max((r.get("time/wall", 0.0) for r in train), default=None)
    diag_s = sum(r.get("balance/diagnose_s", 0.0) for r in train)
    neg = [r["balance/neg_cos_any"] for r in train if "balance/neg_cos_any" in r]
    alphas = sorted({k for r in train for k in r if k.startswith("adv/alpha_")})
    return {"train_s": None if wall is None else wall - diag_s, "diagnose_s": diag_s,
            "neg_cos_frac": statistics.fmean(neg) if neg else None, "diagnosed": len(neg),
            "alpha": {k[len("adv/"):]: statistics.fmean(r[k] for r in train if k in r) for k in alphas}}


def run_one(args, set_name: str, method: str, seed: int) -> dict:
    run_recipe = learning_lib.run_recipe
    name = f"{set_name}-{method}-s{seed}"
    overrides = [*method_overrides(set_name, method), *diagnose_overrides(args.diagnose_every), *args.extra]
    out = run_recipe(RECIPES / f"{set_name}.yaml", seed=seed, iterations=args.iterations, eval_every=0,
                     eval_seeds=args.eval_seed_list, out_dir=args.out, name=name, overrides=overrides,
                     eval_prompts=args.eval_prompts)
    return {"before": out["before"], "after": out["after"], **run_log(Path(out["run_dir"]))}


# --------------------------------------------------------------------------------------------- summaries
def value(point: dict, name: str) -> float | None:
    """The held-out mean of score ``name`` in an evaluation point of the learning library (which keeps
    ``eval/<name>/mean`` as ``<name>``); None when missing or not finite."""
    v = point.get(name)
    return float(v) if v is not None and math.isfinite(float(v)) else None


def gains(runs: list[dict], name: str) -> list[float | None]:
    """Per seed: after − before of the held-out mean of ``name``."""
    out = []
    for r in runs:
        a, b = value(r["after"], name), value(r["before"], name)
        out.append(None if a is None or b is None else a - b)
    return out


def worst_skill_gains(runs: list[dict]) -> list[float | None]:
    """Per seed: the smallest strict-accuracy gain over the skills the evaluation scored."""
    per_skill = [gains(runs, f"shapes/skill_{s}") for s in SKILLS]
    out = []
    for i in range(len(runs)):
        vals = [g[i] for g in per_skill if g[i] is not None]
        out.append(min(vals) if vals else None)
    return out


def summarise_method(runs: list[dict], rewards: tuple[str, ...], skills: bool) -> dict:
    res = {"gain": {r: mean_ci(gains(runs, r)) for r in rewards},
           "point": [mean_ci([value(x["after"], r) for x in runs])["mean"] for r in rewards],
           "base": [mean_ci([value(x["before"], r) for x in runs])["mean"] for r in rewards],
           "train_s": mean_ci([x["train_s"] for x in runs]),
           "neg_cos_frac": mean_ci([x["neg_cos_frac"] for x in runs]),
           "alpha": {k: statistics.fmean(x["alpha"][k] for x in runs if k in x["alpha"])
                     for k in sorted({k for x in runs for k in x["alpha"]})}}
    if skills:
        res["skill_gain"] = {s: mean_ci(gains(runs, f"shapes/skill_{s}")) for s in SKILLS}
        res["worst_skill_gain"] = mean_ci(worst_skill_gains(runs))
    return res


def summarise_set(set_name: str, by_method: dict[str, list[dict]]) -> dict:
    rewards, sweep = SETS[set_name]
    methods = {m: summarise_method(runs, rewards, set_name == "specialist") for m, runs in by_method.items()}
    base = next(iter(methods.values()))["base"]
    complete = {m: s for m, s in methods.items() if None not in s["point"] and None not in base}
    best = [max(s["point"][k] for s in complete.values()) for k in range(len(rewards))] if complete else None
    ws = [m for m in complete if m.startswith("ws")]
    for m, s in complete.items():
        s["hv"] = hypervolume(s["point"], base)
        norm = [(s["point"][k] - base[k]) / (best[k] - base[k])
                for k in range(len(rewards)) if best[k] > base[k]]
        s["worst_normalised_gain"] = min(norm) if norm else None
        s["dominated_by"] = [w for w in ws if w != m and dominates(complete[w]["point"], s["point"])]
    for m in ws:
        methods[m]["weights"] = list(sweep[int(m[2:])])
    return {"rewards": list(rewards), "base": base, "methods": methods,
            "hv_sweep_median": statistics.median(complete[m]["hv"] for m in ws) if ws else None}


def headline(result: dict) -> None:
    """worst_gain_margin, <set>/dominated|hv|hv_sweep_median and marble_cost_ratio, in place."""
    sets = result["sets"]
    spec = sets.get("specialist")
    if spec:
        worst = {m: s["worst_skill_gain"]["mean"] for m, s in spec["methods"].items()
                 if s["worst_skill_gain"]["mean"] is not None}
        bal = [v for m, v in worst.items() if m in BALANCERS]
        sw = [v for m, v in worst.items() if m.startswith("ws")]
        result["worst_gain_margin"] = max(bal) - max(sw) if bal and sw else None
    for name, s in sets.items():
        if name == "specialist":
            continue
        bal = {m: v for m, v in s["methods"].items() if m in BALANCERS and "hv" in v}
        result[f"{name}/dominated"] = {m: bool(v["dominated_by"]) for m, v in bal.items()}
        result[f"{name}/hv"] = {m: v["hv"] for m, v in bal.items()}
        result[f"{name}/hv_sweep_median"] = s["hv_sweep_median"]
    ratios = [s["methods"]["marble"]["train_s"]["mean"] / s["methods"]["ws0"]["train_s"]["mean"]
              for s in sets.values() if {"marble", "ws0"} <= set(s["methods"])
              and s["methods"]["ws0"]["train_s"]["mean"]]
    result["marble_cost_ratio"] = statistics.fmean(ratios) if ratios else None


# ------------------------------------------------------------------------------------------------- main
def plan(args) -> list[tuple[str, str]]:
    """(set, method) pairs to run: the sweep as ws0 … ws<n−1> (ws0 = the recipe's equal weights). ``--quick``
    keeps two sweep points, MARBLE and one other balancer per set (each balancer runs in some set)."""
    methods = args.methods.split(",")
    for m in methods:
        if m != "ws" and m not in BALANCERS:
            raise SystemExit(f"unknown method {m!r}; choose from ws, {', '.join(BALANCERS)}")
    out = []
    for i, set_name in enumerate(args.sets.split(",")):
        if set_name not in SETS:
            raise SystemExit(f"unknown set {set_name!r}; choose from {', '.join(SETS)}")
        n = 2 if args.quick else len(SETS[set_name][1])
        others = [b for b in BALANCERS if b != "marble"]
        keep = {"ws", "marble", others[i % len(others)]} if args.quick else set(methods)
        for m in (m for m in methods if m in keep):
            out += [(set_name, f"ws{j}") for j in range(n)] if m == "ws" else [(set_name, m)]
    return out


def main(argv: list[str]) -> dict:
    args = parse(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    args.eval_seed_list = [int(s) for s in args.eval_seeds.split(",")]
    args.extra, args.eval_prompts = [], None
    if args.quick:
        seeds, args.iterations, args.eval_seed_list, args.diagnose_every = seeds[:1], 1, [0], 1
        args.eval_prompts = 18
        args.extra = ["train.prompts_per_iter=4", "train.group_size=2", "train.micro_batch=4"]
    result: dict = {"bench": "balancers", "quick": args.quick, "iterations": args.iterations, "seeds": seeds,
                    "eval_seeds": args.eval_seed_list,
                    "diagnostics": bool(diagnose_overrides(args.diagnose_every)), "sets": {}}
    runs: dict[str, dict[str, list[dict]]] = {}
    for set_name, method in plan(args):
        for seed in seeds:
            print(f"[balancers] {set_name} {method} seed {seed} ...", file=sys.stderr, flush=True)
            runs.setdefault(set_name, {}).setdefault(method, []).append(run_one(args, set_name, method, seed))
    for set_name, by_method in runs.items():
        result["sets"][set_name] = summarise_set(set_name, by_method)
        try:
            result["sets"][set_name]["plot"] = rel(learning_lib.plot_reward_space(
                result["sets"][set_name], Path(args.out) / f"balancers_{set_name}.png"))
        except Exception as e:      # a plot is a convenience; the figures above are the result
            result["sets"][set_name]["plot_error"] = repr(e)
    headline(result)
    result["targets"] = {"worst_gain_margin": ">= 0.03", "<set>/dominated": "false for the best balancer",
                         "<set>/hv": ">= <set>/hv_sweep_median for the best balancer", "marble_cost_ratio": "<= 1.05"}
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
