"""Regime benchmark: where the card's features pay, and the default job a newcomer runs first.

    python scripts/bench.py regime [--parts default_job,search,pools,trees,balancers] [--seeds 0,1,2] [--out DIR]
                                   [--carry regime.json] [--quick]

- ``default_job`` [``default_job_wall_s``, ``default_job_gain``, ``default_job_palette_ratio``]: ``python
  scripts/train.py run.seed=S`` exactly as a newcomer runs it (``configs/default.yaml`` as shipped, one subprocess
  per training seed, the evaluation seeds fixed by the recipe), timed end to end (start-up, model load, both
  evaluations, training). Per seed: held-out strict gain (after − before), palette-distance ratio (after ÷ before),
  the drift alarms raised by the "after" evaluation, and whether ``eval/before_after.png`` was written. The headline
  keys are the seed means (``_se``: standard error over seeds); ``default_job_wall_s`` is the slowest seed's wall.

- ``search`` [``dts_nfe_to_bestofn``]: DTS* against best-of-N on a reward best-of-N does not saturate
  (``regime_search``: strict + 0.5·partial on the relation and counting prompts, 4 samples, 20 steps, CPS
  expansions; ``--search-seeds``).
- ``pools`` [``pool_nfe_ratio``, ``pool_strict_gap``]: the pools benchmark (``pools``: candidate-pool NFT against
  naive 32-in-8 selection, 40 iterations, ``--seeds`` training seeds) at ``--pool-steps`` steps with the pool's
  x̂0 exit at ``--pool-fraction`` of them.
- ``balancers`` [``balancer_worst_margin``]: from the balancers benchmark's result (``--balancers-result``, its
  three conflict sets, 60 iterations, 3 seeds; not retrained here), per set the best balancer's worst-reward
  held-out gain − the best weighted-sum sweep point's; the key is the set where that margin is largest.
- ``trees`` [``tree_nfe_to_flat_final``]: the trees benchmark's learning part (flat GRPO as shipped against
  tree-GRPO, ``--seeds`` training seeds, equal rollout NFEs ``--tree-budget``) at ``--tree-steps`` steps with
  BranchGRPO's binary splits ``--tree-splits`` (the group is the 2^splits leaves), split noise ``--tree-noise``
  and ``--tree-prompts`` trees per iteration; wall seconds per run are reported beside the NFEs.

A study key whose part did not run is null and named in ``not_run``. The last line printed is the JSON result.
``--quick`` (2 iterations, 4 prompts, one seed; a tiny search) checks the script end to end; its figures are not
results.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flowrl.bench import regime_search
from flowrl.bench.paths import REPO

STUDY_KEYS = ("tree_nfe_to_flat_final", "dts_nfe_to_bestofn", "pool_nfe_ratio", "pool_strict_gap",
              "balancer_worst_margin")
TARGETS = {"default_job_wall_s": "<= 300", "default_job_gain": ">= 0.08", "default_job_palette_ratio": "<= 1.25",
           "default_job_alarms": "none", "tree_nfe_to_flat_final": "<= 0.7", "dts_nfe_to_bestofn": "<= 0.5",
           "pool_nfe_ratio": "<= 0.6", "pool_strict_gap": "<= 0.01", "balancer_worst_margin": ">= 0.03"}


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench.py regime", description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="default_job", help=f"comma-separated parts of {sorted(PARTS)}")
    ap.add_argument("--seeds", default="0,1,2", help="training seeds of the default job")
    ap.add_argument("--out", default=None, help="run directories go here (default: a temporary folder)")
    ap.add_argument("--quick", action="store_true", help="end-to-end check of the script")
    ap.add_argument("--carry", default=None, help="a previous regime.json: the parts not run now keep its figures")
    regime_search.add_args(ap)
    g = ap.add_argument_group("pools")
    g.add_argument("--pool-steps", type=int, default=8)
    g.add_argument("--pool-fraction", type=float, default=0.25, help="the pool scout's x0-exit fraction")
    g = ap.add_argument_group("balancers")
    g.add_argument("--balancers-result", default=str(REPO / "docs" / "benchmarks" / "balancers.json"),
                   help="the balancers benchmark's result file the balancers part reads")
    g = ap.add_argument_group("trees")
    g.add_argument("--tree-steps", type=int, default=20, help="rollout and evaluation steps of both methods")
    g.add_argument("--tree-splits", default="0,3,6,9", help="BranchGRPO's binary split steps")
    g.add_argument("--tree-noise", type=float, default=1.0, help="the split-noise scale")
    g.add_argument("--tree-prompts", type=int, default=4, help="tree prompts per iteration (flat: 8 prompts x 4)")
    g.add_argument("--tree-budget", type=int, default=25600, help="rollout NFEs per run")
    g.add_argument("--tree-evals", type=int, default=4, help="evaluations per run besides 'before'")
    g.add_argument("--tree-eval-seeds", default="0,1", help="images per held-out prompt in each evaluation")
    args = ap.parse_args(argv)
    if args.quick:
        args.search_prompts, args.search_steps, args.search_fractions = 2, 4, "0.5,1.0"
    args.seeds = [int(s) for s in args.seeds.split(",")][:1 if args.quick else None]
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        ap.error(f"--parts: unknown {unknown}; choose from {sorted(PARTS)}")
    return args


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and standard error over seeds (None for one seed)."""
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values))


def job_figures(run_dir: Path) -> dict:
    """Before/after figures of one finished default-job run, read from its ``metrics.jsonl``."""
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in recs if "eval/shapes/strict/mean" in r]
    if len(evals) < 2:
        raise RuntimeError(f"regime: {run_dir} holds {len(evals)} evaluations, not before and after")
    before, after = evals[0], evals[-1]
    return {"strict_before": before["eval/shapes/strict/mean"], "strict_after": after["eval/shapes/strict/mean"],
            "gain": after["eval/shapes/strict/mean"] - before["eval/shapes/strict/mean"],
            "palette_ratio": after["eval/palette_distance/mean"] / before["eval/palette_distance/mean"],
            "alarms": sorted(k[len("eval/alarm/"):] for k, v in after.items() if k.startswith("eval/alarm/") and v),
            "before_after_png": (run_dir / "eval" / "before_after.png").is_file()}


def run_default_job(seed: int, out: Path, quick: bool) -> dict:
    """``scripts/train.py run.seed=<seed>`` in a subprocess as shipped (``--quick``: 2 iterations, 4 prompts)."""
    name = f"default_s{seed}"
    cmd = [sys.executable, str(REPO / "scripts/train.py"), f"run.seed={seed}", f"run.name={name}",
           f"run.output_dir={out}", "log.progress=false"]
    if quick:
        cmd += ["train.iterations=2", "eval.num_prompts=4"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"regime: default job seed {seed} exited {proc.returncode}: {proc.stderr[-400:]}")
    printed = "before | after (same prompts and seeds):" in proc.stdout
    return {"seed": seed, "wall_s": round(wall, 1), "printed_before_after": printed, **job_figures(out / name)}


def default_job(args, out: Path) -> dict:
    runs = [run_default_job(s, out, args.quick) for s in args.seeds]
    gain, gain_se = mean_se([r["gain"] for r in runs])
    ratio, ratio_se = mean_se([r["palette_ratio"] for r in runs])
    return {"default_job_wall_s": max(r["wall_s"] for r in runs), "default_job_gain": gain,
            "default_job_gain_se": gain_se, "default_job_palette_ratio": ratio,
            "default_job_palette_ratio_se": ratio_se,
            "default_job_alarms": sorted({a for r in runs for a in r["alarms"]}),
            "default_job_runs": runs}


def search(args, out: Path) -> dict:
    return regime_search.search(args)


def pools(args, out: Path) -> dict:
    """The pools benchmark's pool and naive methods in the regime chosen by ``--pool-steps``/``--pool-fraction``."""
    from flowrl.bench.benchmarks import pools as pools_bench

    argv = ["--methods", "naive,pool", "--seeds", ",".join(map(str, args.seeds)), "--steps", str(args.pool_steps),
            "--scout-fraction", str(args.pool_fraction), "--out", str(out / "pools"), *(["--quick"] * args.quick)]
    res = pools_bench.main(argv)
    res.pop("plot", None)
    return {"pool_nfe_ratio": res.get("pool_nfe_ratio"), "pool_strict_gap": res.get("pool_strict_gap"),
            "pools": res}


def trees(args, out: Path) -> dict:
    """The trees benchmark's flat GRPO against tree-GRPO at equal rollout NFEs, in the ``--tree-*`` regime."""
    from flowrl.bench.benchmarks import trees as trees_bench

    argv = ["--parts", "learning", "--methods", "flat_grpo,tree_grpo", "--seeds", ",".join(map(str, args.seeds)),
            "--steps", str(args.tree_steps), "--splits", args.tree_splits, "--split-noise", str(args.tree_noise),
            "--tree-prompts", str(args.tree_prompts), "--budget", str(args.tree_budget),
            "--evals", str(args.tree_evals), "--eval-seeds", args.tree_eval_seeds, "--out", str(out / "trees")]
    res = trees_bench.main([*argv, *(["--quick"] * args.quick)])["learning"]
    res.pop("plot", None)
    return {"tree_nfe_to_flat_final": res.get("tree_nfe_to_flat_final"), "trees": res}


def worst_reward_margins(result: dict) -> dict:
    """Per reward set of a balancers result: best balancer's worst-reward gain − the best sweep point's, where a
    method's worst-reward gain is min_k (its seed-mean held-out gain on training reward k). Methods are told apart
    as the balancers benchmark's ``headline`` does: its ``BALANCERS`` against the ``ws<i>`` sweep points."""
    from flowrl.bench.benchmarks.balancers import BALANCERS

    out = {}
    for name, st in result["sets"].items():
        worst = {m: min(g["mean"] for g in v["gain"].values()) for m, v in st["methods"].items()}
        sweep = max(v for m, v in worst.items() if m.startswith("ws"))
        best = max((v, m) for m, v in worst.items() if m in BALANCERS)
        out[name] = {"margin": best[0] - sweep, "balancer": best[1], "balancer_worst": best[0],
                     "best_sweep_worst": sweep}
    return out


def balancers(args, out: Path) -> dict:
    """The worst-reward margins of the balancers benchmark's runs (``--balancers-result``; no training here: the
    sweep and four balancers × 3 seeds × 3 sets take hours on this machine, rerun them with ``bench.py balancers``)."""
    res = json.loads(Path(args.balancers_result).read_text().splitlines()[-1])
    margins = worst_reward_margins(res)
    best = max(margins, key=lambda k: margins[k]["margin"])
    return {"balancer_worst_margin": margins[best]["margin"],
            "balancers": {"set": best, "per_set": margins, "iterations": res.get("iterations"),
                          "seeds": res.get("seeds"), "worst_skill_margin_specialist": res.get("worst_gain_margin"),
                          "source": "bench.py balancers (docs/benchmarks/balancers.json)"}}


PARTS = {"default_job": default_job, "search": search, "pools": pools, "trees": trees, "balancers": balancers}
PART_KEYS = {"default_job": ("default_job_wall_s", "default_job_gain", "default_job_gain_se",
                             "default_job_palette_ratio", "default_job_palette_ratio_se", "default_job_alarms",
                             "default_job_runs", "machine_note"),
             "search": ("dts_nfe_to_bestofn", "search"), "pools": ("pool_nfe_ratio", "pool_strict_gap", "pools"),
             "trees": ("tree_nfe_to_flat_final", "trees"), "balancers": ("balancer_worst_margin", "balancers")}


def carry(result: dict, path: str) -> None:
    """Copy the figures of the parts ``result`` did not run from a previous result file (``carried`` names them)."""
    old = json.loads(Path(path).read_text().splitlines()[-1])
    done = set(old.get("parts", [])) | set(old.get("carried", []))
    for part, keys in PART_KEYS.items():
        if part not in result["parts"] and part in done:
            result.update({k: old[k] for k in keys if k in old})
            result.setdefault("carried", []).append(part)


def main(argv: list[str]) -> dict:
    args = parse(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_regime_"))
    result: dict = {"bench": "regime", "quick": args.quick, "parts": args.parts, "seeds": args.seeds}
    result.update({k: None for k in STUDY_KEYS})
    for part in args.parts:
        result.update(PARTS[part](args, out))
    if args.carry:
        carry(result, args.carry)
    ran = {k for p in [*args.parts, *result.get("carried", [])] for k in PART_KEYS[p]}
    result["not_run"] = [k for k in STUDY_KEYS if k not in ran]
    result["targets"] = TARGETS
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
