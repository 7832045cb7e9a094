"""Throughput benchmark (issue 34): each lever measured as a ratio against the exact synchronous path, side by
side in one run on the shipped toy model.

    python scripts/bench.py throughput [--seeds 0,1,2] [--iterations 20] [--steps N] [--grpo-window YAML] [--quick]

- **async rewards**: ``configs/toy/grpo.yaml`` (``--async-recipe``) with the reward behind a set latency
  (``rewards.latency``, ``--latency`` seconds per rollout chunk spread per image; default: the measured rollout
  time of one chunk, so reward latency ≈ rollout time), ``--chunk`` rows per chunk; the same iterations
  synchronously and with ``train.async_rewards``: ``async_wall_ratio`` = async ÷ sync mean iteration wall
  (target ≤ 0.75),
  ``async_bitwise`` = the final weights and every iteration's reward mean are equal bit for bit,
  ``async_rollout_reward_ratio`` = the same ratio of rollout + reward wait only (the update is not overlapped:
  where it dominates the iteration, the whole-iteration ratio cannot reach 0.75), and the stage split
  (``time/rollout_s``, ``time/reward_s``, ``time/update_s``) of both.
- **rollout accelerators**: the rollout stage's wall (median of ``--repeats`` iterations) of the NFT recipe's ODE
  rollout with each accelerator of ``flowrl.accelerators`` ÷ the exact one; ``accel_rollout_ratio`` is the
  ``--accel`` accelerator's (target ≤ 0.7), and the GRPO rollout with its rollout-correction recompute is
  reported beside it.
- **held-out gain with and without** (``learning_lib``, 3 seeds, ``--gain-recipes``): NFT with ``--accel``
  (decoupled, no correction) and GRPO with ``--grpo-accel`` (default ``--accel``) and, where its stored
  transitions are not the exact policy's, ``sampler.correction`` (TIS, U = 2); ``accel_gain_delta_{nft,grpo}`` =
  mean over seeds of (accelerated − exact) held-out strict gain, with the SE of the paired differences (target:
  within one SE of 0) and GRPO's mean ``rollout_corr/*`` drift metrics.
- **compile**: ``compile_max_abs_diff`` = max |compiled − eager| velocity of the toy transformer (inductor); on a
  GPU also the forward time ratio ``compile_forward_ratio`` (null on CPU).

``--steps`` sets every recipe's rollout and evaluation steps (the shipped toy recipes use 8); ``--grpo-window``
replaces the GRPO recipe's SDE window (e.g. Flow-GRPO-Fast's ``{kind: random, size: 2, window_range: [0, 8]}``:
two stored SDE steps, ODE elsewhere) in every part that runs GRPO.
The last line printed is the JSON result; ``--quick`` (1 seed, 2 iterations, tiny batches) checks the script end
to end in about two minutes, its figures are not results.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from flowrl.bench import learning_lib
from flowrl.bench.paths import REPO

ACCEL = {"cache": "{kind: cache, every: 2}", "cache_fresh_sde": "{kind: cache, every: 2, fresh_sde: true}",
         "cache_fresh_first4": "{kind: cache, every: 2, fresh_first: 4}",
         "fp4": "{kind: fp4, min_dim: 0}", "precision": "{kind: precision}"}
CORRECTION = "sampler.correction={is_threshold: 2.0}"


def accel_overrides(name: str, ratio_based: bool) -> list[str]:
    """``sampler.accelerate`` of the ACCEL entry ``name``, with ``sampler.correction`` under a ratio-based
    objective when the accelerator's stored transitions are not the exact policy's."""
    import yaml

    from flowrl.accelerators import ACCELERATORS

    spec = yaml.safe_load(ACCEL[name])
    acc = ACCELERATORS.get(spec.pop("kind"))(**spec)
    correct = ratio_based and acc.lossy and not acc.stores_exact_steps
    return [f"sampler.accelerate={ACCEL[name]}", *([CORRECTION] if correct else [])]


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench.py throughput", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2", help="training seeds of the held-out gain runs")
    ap.add_argument("--iterations", type=int, default=20, help="iterations of each gain run")
    ap.add_argument("--async-iterations", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=4, help="rows per rollout chunk in the async part")
    ap.add_argument("--async-recipe", default="grpo", help="the recipe of the async part (configs/toy/NAME.yaml)")
    ap.add_argument("--latency", type=float, default=None, help="reward seconds per chunk (default: measured)")
    ap.add_argument("--accel", default="cache", choices=sorted(ACCEL), help="the accelerator of the gain runs")
    ap.add_argument("--grpo-accel", default="", choices=["", *sorted(ACCEL)],
                    help="the accelerator of the GRPO runs (empty: --accel)")
    ap.add_argument("--gain-recipes", default="nft,grpo", help="the recipes of the gain part")
    ap.add_argument("--repeats", type=int, default=3, help="timed rollouts per accelerator")
    ap.add_argument("--eval-seeds", default="0,1,2")
    ap.add_argument("--eval-prompts", type=int, default=0, help="held-out prompts per evaluation (0: all)")
    ap.add_argument("--prompts-per-iter", type=int, default=0, help="override the recipes' (0: keep)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="rollout and evaluation steps of every recipe (0: keep)")
    ap.add_argument("--grpo-window", default="", help="sampler.window of every GRPO run (YAML; empty: keep)")
    ap.add_argument("--skip", default="", help="parts to skip: async,accel,gain,compile")
    ap.add_argument("--out", default=str(REPO / "runs" / "bench_throughput"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes, end-to-end check only")
    args = ap.parse_args(argv)
    if not args.gain_recipes or not set(args.gain_recipes.split(",")) <= {"nft", "grpo"}:
        ap.error(f"--gain-recipes must name nft and/or grpo, got {args.gain_recipes!r}")
    if args.quick:
        args.seeds, args.iterations, args.async_iterations, args.repeats = "0", 2, 2, 1
        args.eval_seeds, args.eval_prompts, args.prompts_per_iter, args.chunk = "0", 4, 2, 2
    return args


def regime(args, recipe: str) -> list[str]:
    """The overrides of ``--steps`` and (for GRPO recipes) ``--grpo-window``."""
    window = [f"sampler.window={args.grpo_window}"] if args.grpo_window and "grpo" in recipe else []
    return learning_lib.steps_overrides(args.steps) + window


def common(args, name: str, recipe: str) -> list[str]:
    ov = [f"run.threads={args.threads}", f"run.output_dir={args.out}", f"run.name={name}", "log.progress=false",
          "eval.before=false", "eval.after=false", "checkpoint.every=0", "run.restart=true", *regime(args, recipe)]
    return ov + ([f"train.prompts_per_iter={args.prompts_per_iter}"] if args.prompts_per_iter else [])


def trainer(recipe: str, overrides: list[str]):
    from flowrl.config import load_config
    from flowrl.training.trainer import Trainer

    return Trainer(load_config(learning_lib.recipe_path(recipe), overrides))


# ------------------------------------------------------------------------------------------------- async

def async_part(args) -> dict:
    base = common(args, "async", args.async_recipe) + [f"sampler.chunk={args.chunk}"]
    latency = args.latency
    if latency is None:                              # reward latency ≈ the rollout time of one chunk
        t = trainer(args.async_recipe, base)
        t.rollout.run(0)
        t0 = time.perf_counter()
        t.rollout.run(1)
        chunks = len(t.rollout.engine.chunks(len(t.rollout.layout.local_rows())))
        latency = (time.perf_counter() - t0) / chunks
    per_image = latency / args.chunk                 # per image: the same total whether scored whole or by chunk
    reward = f"rewards={{shapes: {{reward: delayed, weight: 1.0, kwargs: {{reward: shapes, per_image: {per_image}}}}}}}"
    out = {}
    for mode in ("sync", "async"):
        t = trainer(args.async_recipe, base + [reward, f"train.async_rewards={mode == 'async'}"])
        walls, split, rewards = [], {}, []
        for it in range(args.async_iterations):
            t0 = time.perf_counter()
            m = t.iteration(it)
            walls.append(time.perf_counter() - t0)
            rewards.append(float(m["reward/total/mean"]))
            for k in ("time/rollout_s", "time/reward_s", "time/update_s"):
                split.setdefault(k, []).append(m[k])
        out[mode] = {"wall_s": walls, "split_s": {k: statistics.mean(v) for k, v in split.items()},
                     "rewards": rewards, "weights": {k: v.clone() for k, v in t.policy.adapter_state_dict().items()}}
    s, a = out["sync"], out["async"]
    bitwise = s["rewards"] == a["rewards"] and all(torch.equal(s["weights"][k], a["weights"][k])
                                                   for k in s["weights"])
    skip = 1 if args.async_iterations > 1 else 0     # the first iteration pays one-time costs
    ratio = statistics.mean(a["wall_s"][skip:]) / statistics.mean(s["wall_s"][skip:])
    stage = {m: out[m]["split_s"]["time/rollout_s"] + out[m]["split_s"]["time/reward_s"] for m in out}
    return {"async_wall_ratio": ratio, "async_bitwise": bitwise, "async_reward_latency_s": latency,
            "async_rollout_reward_ratio": stage["async"] / stage["sync"],
            "async_chunk": args.chunk,
            "async_detail": {m: {"iteration_wall_s": out[m]["wall_s"], "split_s": out[m]["split_s"]}
                             for m in out}}


# ------------------------------------------------------------------------------------------ accelerators

def rollout_wall(recipe: str, overrides: list[str], repeats: int) -> float:
    t = trainer(recipe, overrides)
    t.rollout.run(0)                                 # warm-up (and the fp4 copy's first quantisation)
    walls = []
    for it in range(1, repeats + 1):
        t0 = time.perf_counter()
        t.rollout.run(it)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def accel_part(args) -> dict:
    exact = rollout_wall("nft", common(args, "accel_exact", "nft"), args.repeats)
    ratios = {k: rollout_wall("nft", common(args, f"accel_{k}", "nft") + [f"sampler.accelerate={v}"],
                              args.repeats) / exact for k, v in ACCEL.items()}
    grpo_exact = rollout_wall("grpo", common(args, "accel_grpo_exact", "grpo"), args.repeats)
    grpo_accel = args.grpo_accel or args.accel
    grpo = rollout_wall("grpo", common(args, "accel_grpo", "grpo") + accel_overrides(grpo_accel, True),
                        args.repeats)
    return {"accel_rollout_ratio": ratios[args.accel], "accel": args.accel, "accel_rollout_ratios_nft": ratios,
            "accel_rollout_exact_s_nft": exact, "accel_grpo": grpo_accel,
            "accel_rollout_ratio_grpo_corrected": grpo / grpo_exact}


# -------------------------------------------------------------------------------------------------- gains

def drift(run_dir: str) -> dict:
    """Mean ``rollout_corr/*`` of a run's metrics.jsonl."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]
    keys = sorted({k for r in rows for k in r if k.startswith("rollout_corr/")})
    return {k: float(np.mean([r[k] for r in rows if k in r])) for k in keys}


def gain_part(args) -> dict:
    seeds, out = [int(s) for s in args.seeds.split(",")], {}
    extra = [f"train.prompts_per_iter={args.prompts_per_iter}"] if args.prompts_per_iter else []
    arms = {"nft": accel_overrides(args.accel, False), "grpo": accel_overrides(args.grpo_accel or args.accel, True)}
    for recipe in args.gain_recipes.split(","):
        accel = arms[recipe]
        gains = {"exact": [], "accel": []}
        drifts = []
        for seed in seeds:
            for arm, ov in (("exact", []), ("accel", accel)):
                r = learning_lib.run_recipe(
                    recipe, seed=seed, iterations=args.iterations, eval_every=0,
                    eval_seeds=[int(s) for s in args.eval_seeds.split(",")], out_dir=args.out,
                    name=f"gain_{recipe}_{arm}_s{seed}", eval_prompts=args.eval_prompts or None,
                    overrides=[*extra, f"run.threads={args.threads}", *regime(args, recipe), *ov])
                gains[arm].append(r["after"]["strict"] - r["before"]["strict"])
                if arm == "accel" and recipe == "grpo":
                    drifts.append(drift(r["run_dir"]))
        diff = np.subtract(gains["accel"], gains["exact"])
        se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else None
        out[f"accel_gain_delta_{recipe}"] = float(diff.mean())
        out[f"accel_gain_delta_{recipe}_se"] = se
        out[f"accel_gain_{recipe}"] = gains
        if recipe == "grpo":
            out["accel_grpo"] = args.grpo_accel or args.accel
        if any(drifts):
            out["accel_grpo_drift"] = {k: float(np.mean([d[k] for d in drifts if k in d])) for k in drifts[0]}
    return out


# ------------------------------------------------------------------------------------------------ compile

def compile_part(args) -> dict:
    from flowrl.policies.toy import ToyPolicy
    from flowrl.training.parts import compile_policy

    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy = ToyPolicy.from_pretrained(dtype=torch.float32, device=device)
    cond = policy.encode(["a red circle above a blue square"] * 8, None, cfg=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, *policy.latent_shape(32, 32), generator=g).to(device)
    sigma = torch.full((8,), 0.6, device=device)

    def forward_ms(n=20):
        if device == "cpu":
            return None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            policy.velocity(x, sigma, cond, 1.0)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e3

    with torch.no_grad():
        eager, eager_ms = policy.velocity(x, sigma, cond, 1.0), forward_ms()
        compile_policy(policy, type("O", (), {"ratio_based": False})(), None)
        try:
            compiled = policy.velocity(x, sigma, cond, 1.0)
        except Exception as e:                       # inductor unavailable: reported, not fatal
            return {"compile_max_abs_diff": None, "compile_error": f"{type(e).__name__}: {str(e)[:200]}"}
        compiled_ms = forward_ms()
    return {"compile_max_abs_diff": float((compiled - eager).abs().max()), "compile_device": device,
            "compile_forward_ratio": None if eager_ms is None else compiled_ms / eager_ms}


def main(argv: list[str]) -> dict:
    args = parse(argv)
    skip = set(filter(None, args.skip.split(",")))
    torch.set_num_threads(args.threads)
    result: dict = {}
    parts = {"async": async_part, "accel": accel_part, "gain": gain_part, "compile": compile_part}
    for name, fn in parts.items():
        if name not in skip:
            t0 = time.perf_counter()
            result.update(fn(args))
            result[f"{name}_bench_s"] = time.perf_counter() - t0
    result["quick"] = bool(args.quick)
    result["steps"], result["grpo_window"] = args.steps or None, args.grpo_window or None
    result["machine"] = learning_lib.machine()
    return result
