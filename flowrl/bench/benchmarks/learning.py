"""Learning on the toy shapes world: several recipes from the same shipped checkpoint, each trained once per seed
for the same budget, with mean ± standard error over seeds.

    python scripts/bench.py learning [--methods grpo,nft,awr | --recipes A.yaml,B.yaml] [--seeds 0,1,2]
        [--iterations 60] [--eval-every 20] [--eval-prompts 0] [--eval-seeds 0-11] [--run-dir runs/bench_learning]
        [--out FILE] [--plot] [--quick] [key=value ...]

A method is a recipe file (``--methods x`` means ``configs/toy/x.yaml``; ``--recipes`` takes paths; its name is the
file's stem), so a new objective, sampler or balancer is one more entry. Every method runs once per training seed
(``run.seed``: prompt order, rollout noise, update draws and LoRA init). Held-out evaluation (the trainer's): all 90
held-out prompts × 12 seeds (1,080 images), 8-step Euler ODE, the same noise at every evaluation; the "before"
evaluation is the same for every method and seed and is computed once. Reported per method: strict accuracy,
partial credit, palette distance and seed diversity before and after (mean and SE over seeds), the gains, the
detector means and drift alarms at the end, and curves against cumulative rollout NFEs, training NFEs and training
wall time (definitions: ``learning_lib``). ``eval_se`` is the standard error of one evaluation (binomial, and a
bootstrap over prompts); ``gain_eval_se`` the bootstrap SE of one run's paired after − before difference.

``nft_nfe_to_grpo_final`` (DiffusionNFT's "up to 25× fewer steps than Flow-GRPO", arXiv 2509.16117): GRPO's final
rollout NFEs ÷ the NFEs at which NFT's mean strict curve first reaches GRPO's final mean strict accuracy (linear
between evaluations; null when never reached, or reached before training). ``--plot`` writes
``<out stem>_strict.png`` and ``<out stem>_partial.png`` next to the JSON (mean ± SE bands against rollout NFEs).
``--quick``: 2 iterations, seed 0, 10 prompts × 2 eval seeds, evaluations every iteration (a check that it runs).

Offline methods (``dpo_offline``) train on a dataset made first at the online rollout budget, counted as their
rollout NFEs; distillation methods (``opd``) distil seed by seed from ``--teacher`` (trained first when not listed)
for ``--distill-iterations`` (default half the others'); few-step methods (``tdm_r1``, trained and evaluated at its
recipe's 4 steps) get the untrained model's evaluation at ``--teacher-steps`` (default 8, 20) as their ``teacher``,
with ``opd_gain_share`` / ``opd_nfe_ratio`` at the top level (``learning_methods``). ``--carry`` copies methods of
earlier result files not rerun; ``table`` holds one markdown row per method (also printed).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flowrl.bench import learning_lib
from flowrl.bench import learning_methods as lm
from flowrl.bench.paths import REPO, rel

QUICK = {"iterations": 2, "eval_every": 1, "seeds": "0", "eval_prompts": 10, "eval_seeds": "0,1"}
DETECT = "detect/"
POINT_KEYS = ("rollout_nfe_mean", "train_nfe_mean", "wall_s_mean", "wall_s_se", "strict_mean", "strict_se",
              "partial_mean", "partial_se", "palette_mean", "palette_se", "diversity_mean", "diversity_se")


def int_list(text: str, what: str) -> list[int]:
    """"0,1,2" or a range "0-11" → ints."""
    try:
        if "-" in text and "," not in text:
            a, b = (int(v) for v in text.split("-"))
            return list(range(a, b + 1))
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{what} must be comma-separated integers or a range a-b, got {text!r}") from None


def parse(argv):
    ap = argparse.ArgumentParser(prog="bench.py learning", description=__doc__.split("\n")[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--methods", default="grpo,nft,awr", help="recipe names in configs/toy/")
    which.add_argument("--recipes", default=None, help="comma-separated recipe paths (name = file stem)")
    ap.add_argument("--seeds", default="0,1,2", help="training seeds (run.seed), one run each per method")
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=20, help="iterations between evaluations (0: before/after)")
    ap.add_argument("--eval-prompts", type=int, default=0, help="held-out prompts per evaluation (0: all 90)")
    ap.add_argument("--eval-seeds", default="0-11", help="evaluation seeds (images per prompt)")
    ap.add_argument("--run-dir", default=str(REPO / "runs" / "bench_learning"), help="where the runs are written")
    ap.add_argument("--out", default=None, help="also write the result JSON to this file")
    ap.add_argument("--plot", action="store_true", help="PNG curves next to --out (else in --run-dir)")
    ap.add_argument("--quick", action="store_true", help="a tiny end-to-end check (about a minute)")
    ap.add_argument("--teacher", default="grpo", help="the method a distillation recipe (opd) distils from")
    ap.add_argument("--distill-iterations", type=int, default=0,
                    help="iterations of a distillation recipe (0: half of --iterations, i.e. half the teacher's NFEs)")
    ap.add_argument("--teacher-steps", default="8,20",
                    help="Euler steps at which a few-step method's untrained model is evaluated for reference")
    ap.add_argument("--carry", default="", help="comma-separated earlier result JSONs: their methods not rerun "
                                                 "are copied into this result (marked carried_from)")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if args.iterations < 1 or args.eval_every < 0 or args.eval_prompts < 0:
        raise SystemExit("--iterations must be >= 1, --eval-every and --eval-prompts >= 0")
    return args


def methods_of(args, lib) -> dict[str, Path]:
    """{method name: recipe path} from --recipes (paths) or --methods (names in configs/toy/); every recipe is
    loaded with the overrides first, so a typo stops the benchmark before its first run, not an hour in."""
    from flowrl.config import load_config

    items = args.recipes.split(",") if args.recipes else args.methods.split(",")
    out: dict[str, Path] = {}
    for item in (i.strip() for i in items if i.strip()):
        name = Path(item).stem
        if name in out:
            raise SystemExit(f"two recipes are named {name!r}; rename one file")
        try:
            out[name] = lib.recipe_path(item)
            load_config(out[name], list(args.overrides))
        except ValueError as e:
            raise SystemExit(f"method {name!r}: {e}") from None
    if not out:
        raise SystemExit("no methods given; e.g. --methods grpo,nft,awr")
    return out


def r(v, nd: int = 4):
    """Rounded for the JSON; whole numbers as ints, None kept."""
    if v is None:
        return None
    return int(v) if float(v).is_integer() else round(float(v), nd)


def method_summary(agg: dict, runs: list[dict]) -> dict:
    """The per-method figures of the result JSON from ``aggregate`` and the runs."""
    b, a, g = agg["before"], agg["after"], agg["gain"]
    out = {"recipe": runs[0]["recipe"]}
    for m in ("strict", "partial", "palette", "diversity"):
        out[f"{m}_before"] = r(b.get(f"{m}_mean"), 5)
        out[f"{m}_after_mean"], out[f"{m}_after_se"] = r(a.get(f"{m}_mean"), 5), r(a.get(f"{m}_se"), 5)
    out["gain_mean"], out["gain_se"] = r(g.get("strict_mean")), r(g.get("strict_se"))
    out["gain_eval_se"] = r(agg["gain_se_eval"].get("strict"))
    out["partial_gain_mean"], out["partial_gain_se"] = r(g.get("partial_mean")), r(g.get("partial_se"))
    out["rollout_nfe"], out["train_nfe_mean"] = r(a.get("rollout_nfe_mean")), r(a.get("train_nfe_mean"))
    out["wall_s_mean"], out["wall_s_se"] = r(a.get("wall_s_mean"), 1), r(a.get("wall_s_se"), 1)
    out["train_cpu_s_mean"] = r(a.get("train_cpu_s_mean"), 1)
    out["detect_before"] = {k[len(DETECT):-5]: r(v, 5) for k, v in b.items() if k.startswith(DETECT)
                            and k.endswith("_mean")}
    out["detect_after_mean"] = {k[len(DETECT):-5]: r(v, 5) for k, v in a.items() if k.startswith(DETECT)
                                and k.endswith("_mean")}
    out["alarms_after"] = {k[len("alarm/"):-5]: r(v, 3) for k, v in a.items() if k.startswith("alarm/")
                           and k.endswith("_mean")}          # fraction of seeds whose final evaluation alarmed
    out["curve"] = [[r(p["rollout_nfe_mean"]), r(p.get("strict_mean")), r(p.get("strict_se"))]
                    for p in agg["curve"]]
    out["curve_partial"] = [[r(p["rollout_nfe_mean"]), r(p.get("partial_mean")), r(p.get("partial_se"))]
                            for p in agg["curve"]]
    out["points"] = [{"iteration": p["iteration"], **{k: r(p.get(k), 5) for k in POINT_KEYS}} for p in agg["curve"]]
    out["per_seed"] = [{"seed": run["seed"], "strict_after": r(run["after"]["strict"]),
                        "partial_after": r(run["after"]["partial"]), "wall_s": r(run["after"]["wall_s"], 1),
                        "train_nfe": run["after"]["train_nfe"], "rollout_nfe_counted": run["rollout_nfe_counted"]}
                       for run in runs]
    return out


def shared_before(runs: dict[str, list[dict]]) -> bool:
    """Whether every run started from the one cached "before" evaluation; warns when not (e.g. recipes that
    evaluate with different guidance are then not compared on the same images)."""
    keys = {run["before_key"] for rs in runs.values() for run in rs}
    if len(keys) != 1 or None in keys:
        print("[learning] warning: the methods' 'before' evaluations differ (different eval settings, rewards or "
              "starting weights); compare their gains, not their curves", file=sys.stderr)
    return len(keys) == 1 and None not in keys


def main(argv: list[str]) -> dict:
    args = parse(argv)
    lib = learning_lib
    lib.CACHE.directory = Path(args.run_dir) / "before_cache"
    seeds, eval_seeds = int_list(args.seeds, "--seeds"), int_list(args.eval_seeds, "--eval-seeds")
    runs: dict[str, list[dict]] = {}
    methods, datasets, students = methods_of(args, lib), {}, []
    for name, recipe in list(methods.items()):
        if lm.is_distilled(recipe, args.overrides):
            students.append(name)
            if args.teacher not in methods:                  # the teacher's runs come first
                methods = {args.teacher: lib.recipe_path(args.teacher), **methods}
    for name, recipe in methods.items():
        extra = []
        if lm.is_offline(recipe, args.overrides):
            folder, datasets[name] = lm.offline_dataset(name, recipe, args.run_dir, args.iterations, args.overrides)
            extra.append(f"objective.data={folder}")
        for seed in seeds:
            teach = ([lm.teacher_override(recipe, args.overrides, runs[args.teacher][seeds.index(seed)]["run_dir"])]
                     if name in students else [])
            print(f"[learning] {name} seed {seed} ...", file=sys.stderr, flush=True)
            iterations = (args.distill_iterations or max(1, args.iterations // 2)) if name in students else \
                args.iterations
            runs.setdefault(name, []).append(lib.run_recipe(
                recipe, seed=seed, iterations=iterations, eval_every=args.eval_every, eval_seeds=eval_seeds,
                out_dir=args.run_dir, name=f"{name}_s{seed}", overrides=[*args.overrides, *extra, *teach],
                eval_prompts=args.eval_prompts or None))
    aggs = {name: lib.aggregate(rs) for name, rs in runs.items()}
    first = next(iter(runs.values()))[0]
    before = first["before"]
    evals = [p["eval_s"] for rs in runs.values() for run in rs for p in run["curve"][1:]]
    result = {"bench": "learning", "seeds": seeds, "iterations": args.iterations, "eval_every": args.eval_every,
              "eval_prompts": first["eval_prompts"], "eval_seeds": eval_seeds, "eval_images": first["eval_images"],
              "eval_se": {"strict_binomial": r(before.get("strict_se_binomial")),
                          "strict_bootstrap_prompts": r(before.get("strict_se_bootstrap")),
                          "partial_bootstrap_prompts": r(before.get("partial_se_bootstrap"))},
              "eval_s_mean": r(sum(evals) / len(evals), 1) if evals else None,
              "before_shared": shared_before(runs),
              "overrides": list(args.overrides),
              "methods": {name: method_summary(aggs[name], rs) for name, rs in runs.items()}}
    for metric, suffix in (("strict", ""), ("partial", "_partial")):
        both = {"grpo", "nft"} <= aggs.keys()
        result[f"nft_nfe_to_grpo_final{suffix}"] = (
            r(lib.nfe_ratio(aggs["grpo"], aggs["nft"], metric), 2) if both else None)
        result[f"nft_nfe_to_grpo_final_gain{suffix}"] = (
            r(lib.nfe_ratio(aggs["grpo"], aggs["nft"], metric, gain=True), 2) if both else None)
    for name, made in datasets.items():
        result["methods"][name]["dataset"] = made
    if students:
        result.update(lm.distill_figures(result["methods"], students[0], args.teacher))
    for name, recipe in methods.items():
        if lm.is_few_step(recipe, args.overrides):
            result["methods"][name]["teacher"] = lm.reference_evals(
                recipe, args.overrides, int_list(args.teacher_steps, "--teacher-steps"), eval_seeds,
                args.eval_prompts or None, args.run_dir)
    lm.carry(result, [f for f in args.carry.split(",") if f.strip()])
    result["table"] = lm.table(result["methods"])
    print("\n".join(result["table"]), file=sys.stderr)
    out = Path(args.out) if args.out else None
    if args.plot:
        stem = out.with_suffix("") if out is not None else Path(args.run_dir) / "learning"
        curves = {**aggs, **{n: {"curve": m["points"]} for n, m in result["methods"].items()
                             if n not in aggs and m.get("points")}}       # carried methods: their summaries
        result["plots"] = [rel(lib.plot_curves(curves, f"{stem}_{m}.png", metric=m)) for m in ("strict", "partial")]
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
