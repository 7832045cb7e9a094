"""The moving-shapes video world: video RL on the tiny Wan teacher (part ``rl``) and streaming distillation of it
(part ``distill``), issue #33.

    python scripts/bench.py video --teacher runs/video_toy_pretrain/checkpoint [--parts rl,distill]
        [--methods grpo,dancegrpo,nft] [--seeds 0,1,2] [--iterations 30] [--eval-prompts 56] [--eval-seeds 0,1]
        [--run-dir runs/bench_video] [--out docs/benchmarks/video.json] [--quick] [key=value ...]

``rl``: each recipe ``configs/toy_video/<method>.yaml`` trains once per seed (``run.seed``) from ``--teacher`` for
the same iterations and group geometry, so every method spends the same rollout NFEs (checked: ``equal_nfes``);
the trainer's held-out evaluation (``video_shapes:heldout``, spread within each skill, × ``--eval-seeds``, Euler
ODE, the same noise every time) runs before and after (``flowrl.bench.learning_lib.run_recipe``; finished runs
are reused through ``$FLOWRL_BENCH_RUN_CACHE``). Per method, mean ± SE over seeds: strict and partial before /
after and gain, every check of the verifier (motion sub-scores: direction, speed, bounce, order, appear, static;
temporal consistency ``consistent`` = no flicker / identity swap / jump) after and its gain, palette distance
before / after (drift: image quality), and the 95 % t-interval of the strict gain. ``video_rl_gain_mean`` /
``_se`` are the method with the largest mean strict gain (named in ``video_rl_best``).

``distill``: student ÷ teacher held-out strict, teacher ÷ student forwards per video, KV-cached ÷ recompute cost.
``flowrl/distill`` cannot take this teacher yet (``DISTILL_BLOCKER``): the part reports null with the reason.

``--quick``: the tiny random preset (``policy.tiny=true``, 4 frames, 3 steps), 1 iteration, seed 0, 7 prompts ×
1 seed — a check that it runs end to end (seconds), not a measurement.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flowrl.bench import learning_lib
from flowrl.bench.benchmarks.learning import int_list, r
from flowrl.bench.learning_methods import T95
from flowrl.bench.paths import REPO, rel

RECIPES = REPO / "configs" / "toy_video"
SCORE = "video_shapes"
CHECKS = ("present", "extra", "consistent", "direction", "static", "speed", "bounce", "order", "appear")
SKILLS = ("motion", "speed", "bounce", "pair", "order", "appear", "sequence")
QUICK = ["policy.tiny=true", "sampler.num_frames=4", "sampler.steps=3", "sampler.eval_steps=3",
         "train.prompts_per_iter=2", "train.group_size=2", "train.micro_batch=4", "eval.batch=8"]
DISTILL_BLOCKER = (
    "flowrl/distill builds its causal student, critic and rollouts in Wan's VAE latent space (16 channels, ×4 time "
    "/ ×8 space, AutoencoderKLWan) with a T5 or hash text encoder (flowrl/distill/roles.py, components.py); the "
    "toy_video teacher is pixel space (3 channels, no VAE) with its own word-level UMT5, so it needs an identity-VAE "
    "role and the toy text encoder in the distill roles before ODE init / self-forcing DMD can run on it — not "
    "wired in this change")


def parse(argv):
    ap = argparse.ArgumentParser(prog="bench.py video", description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="rl,distill", help="comma-separated: rl, distill")
    ap.add_argument("--teacher", default=None, help="the toy_video checkpoint (default: the recipes' policy.path)")
    ap.add_argument("--methods", default="grpo,dancegrpo,nft", help="recipe names in configs/toy_video/")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--eval-prompts", type=int, default=56, help="held-out prompts (0: all 208)")
    ap.add_argument("--eval-seeds", default="0,1")
    ap.add_argument("--run-dir", default=str(REPO / "runs" / "bench_video"))
    ap.add_argument("--out", default=None, help="also write the result JSON to this file")
    ap.add_argument("--quick", action="store_true", help="tiny random preset, one iteration (a check that it runs)")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(args.parts) - {"rl", "distill"})
    if unknown or not args.parts:
        raise SystemExit(f"--parts: unknown {unknown or 'empty'}; choose from rl, distill")
    if args.quick:
        args.iterations, args.seeds, args.eval_prompts, args.eval_seeds = 1, "0", 7, "0"
    if args.iterations < 1 or args.eval_prompts < 0:
        raise SystemExit("--iterations must be >= 1 and --eval-prompts >= 0")
    return args


def recipes(args) -> dict[str, Path]:
    out = {}
    for name in (m.strip() for m in args.methods.split(",") if m.strip()):
        path = RECIPES / f"{name}.yaml"
        if not path.is_file():
            raise SystemExit(f"method {name!r}: no recipe {rel(path)}; choose from "
                             f"{sorted(p.stem for p in RECIPES.glob('*.yaml'))}")
        out[name] = path
    if not out:
        raise SystemExit("no methods given; e.g. --methods grpo,dancegrpo,nft")
    return out


def _stat(agg: dict, where: str, key: str) -> tuple:
    block = agg[where]
    return r(block.get(f"{key}_mean"), 5), r(block.get(f"{key}_se"), 5)


def method_summary(agg: dict, runs: list[dict]) -> dict:
    """One method's figures from ``learning_lib.aggregate`` over its seeds."""
    out = {"recipe": runs[0]["recipe"], "seeds": [run["seed"] for run in runs]}
    for name, key in (("strict", f"{SCORE}/strict"), ("partial", f"{SCORE}/partial"),
                      ("palette", "palette"), ("consistency_reward", "video_shapes_consistency")):
        out[f"{name}_before"], _ = _stat(agg, "before", key)
        out[f"{name}_after_mean"], out[f"{name}_after_se"] = _stat(agg, "after", key)
        g = agg["gain"]
        out[f"{name}_gain_mean"], out[f"{name}_gain_se"] = r(g.get(f"{key}_mean"), 5), r(g.get(f"{key}_se"), 5)
    n, mean, se = len(runs), out["strict_gain_mean"], out["strict_gain_se"]
    t = T95.get(n - 1)
    out["strict_gain_ci95"] = [r(mean - t * se), r(mean + t * se)] if None not in (mean, se, t) else None
    out["checks"] = {c: {"before": _stat(agg, "before", f"{SCORE}/{c}")[0],
                         "after_mean": _stat(agg, "after", f"{SCORE}/{c}")[0],
                         "gain_mean": r(agg["gain"].get(f"{SCORE}/{c}_mean"), 5),
                         "gain_se": r(agg["gain"].get(f"{SCORE}/{c}_se"), 5)} for c in CHECKS}
    out["skills_after_mean"] = {s: _stat(agg, "after", f"{SCORE}/skill_{s}")[0] for s in SKILLS}
    out["palette_drift"] = (r(out["palette_after_mean"] / out["palette_before"], 3)
                            if out["palette_before"] and out["palette_after_mean"] is not None else None)
    out["rollout_nfe"] = r(agg["after"].get("rollout_nfe_mean"))
    out["train_nfe_mean"] = r(agg["after"].get("train_nfe_mean"))
    out["wall_s_mean"] = r(agg["after"].get("wall_s_mean"), 1)
    out["per_seed"] = [{"seed": run["seed"], "strict_after": r(run["after"].get(f"{SCORE}/strict"), 5),
                        "partial_after": r(run["after"].get(f"{SCORE}/partial"), 5),
                        "reused": bool(run.get("reused"))} for run in runs]
    return out


def part_rl(args) -> dict:
    lib = learning_lib
    lib.CACHE.directory = Path(args.run_dir) / "before_cache"
    seeds, eval_seeds = int_list(args.seeds, "--seeds"), int_list(args.eval_seeds, "--eval-seeds")
    extra = ([f"policy.path={args.teacher}"] if args.teacher else []) + (QUICK if args.quick else [])
    methods, first = {}, None
    for name, recipe in recipes(args).items():
        runs = []
        for seed in seeds:
            print(f"[video] {name} seed {seed} ...", file=sys.stderr, flush=True)
            runs.append(lib.run_recipe(recipe, seed=seed, iterations=args.iterations, eval_every=0,
                                       eval_seeds=eval_seeds, out_dir=args.run_dir, name=f"{name}_s{seed}",
                                       overrides=[*extra, *args.overrides], eval_prompts=args.eval_prompts or None))
        first = first or runs[0]
        methods[name] = method_summary(lib.aggregate(runs), runs)
    best = max(methods, key=lambda k: methods[k]["strict_gain_mean"] if methods[k]["strict_gain_mean"] is not None
               else float("-inf"))
    nfes = {m["rollout_nfe"] for m in methods.values()}
    return {"seeds": seeds, "iterations": args.iterations, "eval_prompts": first["eval_prompts"],
            "eval_seeds": eval_seeds, "eval_images": first["eval_images"], "equal_nfes": len(nfes) == 1,
            "video_rl_best": best, "video_rl_gain_mean": methods[best]["strict_gain_mean"],
            "video_rl_gain_se": methods[best]["strict_gain_se"], "methods": methods}


def teacher_record(path: str | None) -> dict:
    """The teacher as a committed result names it: its path (relative to the checkout, else its folder name) and
    the pretraining step and minutes from its ``info.json`` (``scripts/pretrain_video_toy.py``), when present."""
    if path is None:
        return {"teacher": None, "teacher_step": None, "teacher_minutes": None}
    info = Path(path) / "info.json"
    meta = json.loads(info.read_text()) if info.is_file() else {}
    return {"teacher": rel(path, outside="name"), "teacher_step": meta.get("step"),
            "teacher_minutes": meta.get("minutes")}


def part_distill(args) -> dict:
    return {"student_strict_ratio": None, "student_forward_ratio": None, "cache_ratio": None,
            "distill_reason": DISTILL_BLOCKER}


def table(methods: dict) -> list[str]:
    """One markdown row per method (strict, gain ± SE, 95 % interval, partial gain, consistency, palette drift)."""
    rows = ["| method | strict before → after | gain ± SE | 95 % interval | partial gain | consistent after | "
            "palette ×base | rollout NFEs |", "|---|---|---|---|---|---|---|---|"]

    def f(v, fmt="{:+.3f}"):
        return "—" if v is None else fmt.format(v)

    for name, m in methods.items():
        ci = m["strict_gain_ci95"] or [None, None]
        rows.append(f"| {name} | {f(m['strict_before'], '{:.3f}')} → {f(m['strict_after_mean'], '{:.3f}')} | "
                    f"{f(m['strict_gain_mean'])} ± {f(m['strict_gain_se'], '{:.3f}')} | [{f(ci[0])}, {f(ci[1])}] | "
                    f"{f(m['partial_gain_mean'])} | {f(m['checks']['consistent']['after_mean'], '{:.3f}')} | "
                    f"{f(m['palette_drift'], '×{:.2f}')} | {m['rollout_nfe']} |")
    return rows


def main(argv: list[str]) -> dict:
    args = parse(argv)
    result: dict = {"bench": "video", "quick": args.quick, **teacher_record(args.teacher),
                    "overrides": list(args.overrides), "machine": learning_lib.machine()}
    keys = ("video_rl_gain_mean", "video_rl_gain_se", "student_strict_ratio", "student_forward_ratio", "cache_ratio")
    result.update(dict.fromkeys(keys))
    if "rl" in args.parts:
        result["rl"] = part_rl(args)
        result["video_rl_gain_mean"] = result["rl"]["video_rl_gain_mean"]
        result["video_rl_gain_se"] = result["rl"]["video_rl_gain_se"]
        result["table"] = table(result["rl"]["methods"])
        print("\n".join(result["table"]), file=sys.stderr)
    if "distill" in args.parts:
        result["distill"] = part_distill(args)
        result.update({k: result["distill"][k] for k in keys[2:]})
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
