"""Trees benchmark (issue #13): what one tree forward costs, whether tree-GRPO learns faster
per rollout NFE than flat GRPO and the MixGRPO window, and whether DTS* beats best-of-N at a fraction of its
NFE.

    python scripts/bench.py trees [--parts engine,learning,search] [--seeds 0,1,2] [--budget 10240] [--quick]

Parts (each on the shipped toy model, CPU, one thread):

- ``engine``: the same model, prompts and chunking (``--micro-batch`` rows per model call) through the flat
  engine (GRPO recipe: ``--group`` samples per prompt, one chunk of rows per ``samplers.rollout`` call, as the
  rollout stage does) and through the tree engine (BranchGRPO's toy tree: binary splits at 0, 2, 4 of 8 steps,
  one ``tree_rollout`` over all prompts with ``max_batch``). ``frontier_cost_ratio`` = (tree CPU seconds per
  rollout forward) ÷ (flat CPU seconds per forward), fastest of ``--repeats`` alternated runs (target ≤ 1.1:
  the frontier batching adds no cost per forward). Process CPU time, so other jobs on a shared machine skew it
  less.
- ``learning``: flat GRPO (``configs/toy/grpo.yaml``), tree-GRPO (``configs/toy/trees/branchgrpo.yaml``) and
  the MixGRPO sliding window (grpo.yaml with ``sampler.window`` sliding, ``--mix-window`` SDE steps moving
  every ``--mix-every`` iterations; ODE elsewhere) at **equal rollout NFEs** (``--budget``; each method runs
  ⌈budget / its NFEs per iteration⌉ iterations), ``--seeds`` training seeds, through the learning-benchmark
  library (``learning_lib``: held-out strict / partial credit / palette distance / seed diversity, mean ±
  SE over seeds). ``tree_nfe_to_flat_final`` = the rollout NFEs at which tree-GRPO's mean strict curve first
  reaches flat GRPO's final mean ÷ flat GRPO's final rollout NFEs (target ≤ 0.6; null when never reached, or
  when tree-GRPO starts at or above it); ``mix_nfe_to_flat_final`` likewise; ``tree_partial_gain_at_budget`` =
  tree − flat final partial credit (target ≥ 0.02); ``tree_palette_ratio`` = tree ÷ flat final palette
  distance (target ≤ 1.1); diversities side by side. The regime options (``--steps`` for every method;
  ``--splits``, ``--split-noise``, ``--tree-prompts`` for the tree; ``--methods`` to run a subset) move the
  comparison off the shipped 8-step recipes, e.g. to BranchGRPO's 20 steps with binary splits at 0, 3, 6, 9.
- ``search``: best-of-N with ``--search-budget`` NFEs (⌊budget/8⌋ ODE samples) against DTS* at 1/8, 1/4, 1/2
  and 1 × that budget (``samplers.search``, flow_sde a = 0.7 expansions) on ``--search-prompts`` held-out
  prompts, the verifier's score as reward. ``dts_nfe_to_bestofn`` = the NFEs at which DTS*'s mean reward curve
  first reaches best-of-N's mean ÷ best-of-N's NFEs (target ≤ 0.5; null when never reached).

The last line printed is the JSON result. ``--quick`` shrinks everything (≤ 3 minutes, one seed, few prompts)
to check the script end to end; its figures are not results.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from flowrl.bench import learning_lib
from flowrl.bench.paths import REPO, rel

GRPO = REPO / "configs" / "toy" / "grpo.yaml"
TREE = REPO / "configs" / "toy" / "trees" / "branchgrpo.yaml"


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench.py trees", description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="engine,learning,search")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, end-to-end check only (≤ 3 minutes)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(REPO / "runs" / "bench_trees"))
    g = ap.add_argument_group("engine")
    g.add_argument("--prompts", type=int, default=16)
    g.add_argument("--group", type=int, default=8, help="flat samples per prompt (= the tree's leaves)")
    g.add_argument("--micro-batch", type=int, default=16)
    g.add_argument("--repeats", type=int, default=3)
    g = ap.add_argument_group("learning")
    g.add_argument("--seeds", default="0,1,2", help="training seeds")
    g.add_argument("--budget", type=int, default=10240, help="rollout NFEs per run (flat GRPO: 40 its)")
    g.add_argument("--evals", type=int, default=6, help="evaluations per run besides 'before'")
    g.add_argument("--eval-seeds", default="0,1,2", help="images per held-out prompt")
    g.add_argument("--eval-prompts", type=int, default=0, help="held-out prompts per evaluation (0: all)")
    g.add_argument("--mix-window", type=int, default=2)
    g.add_argument("--mix-every", type=int, default=10)
    g.add_argument("--methods", default="flat_grpo,tree_grpo,mixgrpo", help="the learning part's methods")
    g.add_argument("--steps", type=int, default=0, help="rollout and evaluation steps of every method (0: keep 8)")
    g.add_argument("--splits", default="", help="the tree's binary split steps, e.g. 0,3,6,9 (empty: keep)")
    g.add_argument("--split-noise", type=float, default=0.0, help="the tree's split-noise scale (0: keep)")
    g.add_argument("--tree-prompts", type=int, default=0, help="the tree's prompts per iteration (0: keep)")
    g = ap.add_argument_group("search")
    g.add_argument("--search-prompts", type=int, default=16)
    g.add_argument("--search-budget", type=int, default=128)
    g.add_argument("--lam", type=float, default=math.inf, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    methods = set(args.methods.split(","))
    if not {"flat_grpo", "tree_grpo"} <= methods <= {"flat_grpo", "tree_grpo", "mixgrpo"}:
        ap.error(f"--methods {args.methods}: flat_grpo and tree_grpo (the comparison), optionally mixgrpo")
    if args.quick:
        args.prompts, args.repeats, args.seeds, args.budget, args.evals = 4, 1, "0", 600, 1
        args.eval_seeds, args.eval_prompts, args.search_prompts, args.search_budget = "0,1", 4, 2, 32
    return args


# ----------------------------------------------------------------------------------------------- engine
def toy_setup(n_prompts: int, split: str = "shapes:train"):
    import torch

    from flowrl.data.prompts import load_prompts
    from flowrl.policies.toy import ToyPolicy

    policy = ToyPolicy.from_pretrained(dtype=torch.float32)
    items = load_prompts(split, 0).fixed(n_prompts)
    return policy, items


def engine(args) -> dict:
    import torch

    from samplers import KERNELS
    from samplers import tree_spec as ts
    from samplers.engine import SampleSpec, SamplingEngine
    from samplers.rng import sample_generator
    from samplers.windows import AllSteps

    policy, items = toy_setup(args.prompts)
    prompts = [p for p, _ in items]
    kern = KERNELS.get("flow_sde")
    kcfg, steps, mb = kern.Config(noise_level=0.7), 8, args.micro_batch
    plan = AllSteps(skip_last=True).plan(0, steps)
    branch = ts.FixedSplits((0, 2, 4)).plan(0, steps)
    eng = SamplingEngine(policy, SampleSpec(steps, 32, 32, kernel=kern, kernel_cfg=kcfg, store=True, chunk=mb))

    def flat():
        n = len(prompts) * args.group
        gens = [sample_generator(0, 0, r // args.group, r % args.group) for r in range(n)]
        res = eng.sample([prompts[r // args.group] for r in range(n)], gens, plan).result
        return res.nfe * n

    def tree():
        gens = [sample_generator(0, 0, p, 0) for p in range(len(prompts))]
        return eng.grow(prompts, gens, plan, branch)[1].forwards

    best = {"flat": math.inf, "tree": math.inf}
    nfe = {}
    with torch.no_grad():
        for _ in range(args.repeats):
            for name, fn in (("flat", flat), ("tree", tree)):
                t0 = time.process_time()
                nfe[name] = fn()
                best[name] = min(best[name], time.process_time() - t0)
    per = {k: best[k] / nfe[k] for k in best}
    return {"frontier_cost_ratio": per["tree"] / per["flat"], "flat_ms_per_forward": 1e3 * per["flat"],
            "tree_ms_per_forward": 1e3 * per["tree"], "flat_forwards": nfe["flat"],
            "tree_forwards": nfe["tree"], "flat_leaves": len(prompts) * args.group,
            "tree_leaves": len(prompts) * 8, "prompts": len(prompts), "micro_batch": mb}


# --------------------------------------------------------------------------------------------- learning
def nfe_per_iteration(path: Path, overrides: list[str]) -> int:
    """Rollout NFEs of one iteration of a recipe, from its config (flat: P·G·calls; tree: P·Σ frontier)."""
    import random

    import torch

    from flowrl.config import load_config
    from samplers.tree import build_stages, stage_sizes
    from samplers.windows import StepPlan

    cfg = load_config(path, overrides)
    t, s = cfg.train, cfg.sampler
    grid = torch.linspace(1.0, 0.0, s.steps + 1)
    if s.tree is None:
        window = s.window.config
        plan = window.plan(0, s.steps, random.Random(0)) if s.kernel.kind != "ode" else StepPlan(s.steps)
        return t.prompts_per_iter * t.group_size * len(build_stages(grid, plan, _no_split(s.steps)))
    spec = s.tree.spec(None)
    branch = spec.branching.plan(0, s.steps, random.Random(0))
    plan = s.window.config.plan(0, s.steps, random.Random(0))
    sizes, _ = stage_sizes(build_stages(grid, plan, branch), 1, branch.trunk)
    return t.prompts_per_iter * sum(sizes)


def _no_split(steps: int):
    from samplers.tree_spec import BranchPlan

    return BranchPlan(steps)


def learning(args) -> dict:
    L = learning_lib
    seeds = [int(s) for s in args.seeds.split(",")]
    eval_seeds = [int(s) for s in args.eval_seeds.split(",")]
    mix = [f"sampler.window={{kind: sliding, size: {args.mix_window}, iters_per_group: {args.mix_every}}}"]
    steps = L.steps_overrides(args.steps)
    methods = {"flat_grpo": (GRPO, steps), "tree_grpo": (TREE, [*steps, *tree_overrides(args)]),
               "mixgrpo": (GRPO, [*steps, *mix])}
    methods = {k: v for k, v in methods.items() if k in args.methods.split(",")}
    threads = [f"run.threads={args.threads}"]
    out, aggs, plan = {}, {}, {}
    for name, (recipe, ov) in methods.items():
        per_iter = nfe_per_iteration(recipe, ov)
        iters = max(1, math.ceil(args.budget / per_iter))
        plan[name] = {"rollout_nfe_per_iteration": per_iter, "iterations": iters}
        runs = [L.run_recipe(recipe, seed=s, iterations=iters, eval_every=max(1, iters // args.evals),
                             eval_seeds=eval_seeds, out_dir=Path(args.out) / "learning", name=f"{name}_s{s}",
                             overrides=[*ov, *threads], eval_prompts=args.eval_prompts or None)
                for s in seeds]
        aggs[name] = L.aggregate(runs)
        after = aggs[name]["after"]
        out[name] = {**plan[name], **{k: after.get(k) for k in (
            "rollout_nfe_mean", "train_nfe_mean", "wall_s_mean", "strict_mean", "strict_se", "partial_mean",
            "partial_se", "palette_mean", "palette_se", "diversity_mean", "diversity_se")}}
    flat = aggs["flat_grpo"]["after"]
    res = {"methods": out, "seeds": seeds, "steps": args.steps or 8, "tree_overrides": methods["tree_grpo"][1]}
    for key, name in (("tree_nfe_to_flat_final", "tree_grpo"), ("mix_nfe_to_flat_final", "mixgrpo")):
        if name not in aggs:
            continue
        reach = L.nfe_to_reach(aggs[name]["curve"], flat["strict_mean"], y="strict")
        ok = reach and flat["rollout_nfe_mean"]                 # reach 0: the method starts at the target
        res[key] = reach / flat["rollout_nfe_mean"] if ok else None
    tree = aggs["tree_grpo"]["after"]
    res["tree_partial_gain_at_budget"] = _sub(tree.get("partial_mean"), flat.get("partial_mean"))
    res["tree_palette_ratio"] = _div(tree.get("palette_mean"), flat.get("palette_mean"))
    res["tree_diversity_minus_flat"] = _sub(tree.get("diversity_mean"), flat.get("diversity_mean"))
    try:
        res["plot"] = rel(L.plot_curves(aggs, Path(args.out) / "trees_strict.png", metric="strict"))
    except Exception as e:          # a plot is a convenience; the figures above are the result
        res["plot_error"] = repr(e)
    return res


def tree_overrides(args) -> list[str]:
    """The tree recipe's ``--splits`` (binary; the group is the 2^splits leaves), ``--split-noise`` and
    ``--tree-prompts`` overrides."""
    ov = []
    if args.splits:
        splits = [int(s) for s in args.splits.split(",")]
        ov += [f"sampler.tree.branching={{kind: fixed, steps: {splits}, factor: 2}}",
               f"train.group_size={2 ** len(splits)}"]
    if args.split_noise:
        ov.append(f"sampler.tree.noise={{scale: {args.split_noise}}}")
    return ov + ([f"train.prompts_per_iter={args.tree_prompts}"] if args.tree_prompts else [])


def _sub(a, b):
    return None if a is None or b is None else a - b


def _div(a, b):
    return None if a is None or not b else a / b


# ------------------------------------------------------------------------------------------------ search
def search(args) -> dict:
    import torch

    from rewards import RewardSet
    from rewards.base import make_input
    from samplers import KERNELS
    from samplers import search as S
    from samplers.engine import SampleSpec, SamplingEngine

    policy, items = toy_setup(args.search_prompts, "shapes:heldout")
    rewards = RewardSet({"shapes": 1.0})
    kern = KERNELS.get("flow_sde")
    kcfg, steps, budget = kern.Config(noise_level=0.7), 8, args.search_budget
    eng = SamplingEngine(policy, SampleSpec(steps, 32, 32))
    fracs = (0.125, 0.25, 0.5, 1.0)
    bon, dts = [], {f: [] for f in fracs}
    for p, (prompt, meta) in enumerate(items):
        cond = eng.encode([prompt])

        def velocity(x, sigma, cond=cond):
            return policy.velocity(x, sigma, cond.select([0] * x.shape[0]), 1.0)

        noise = eng.noise

        def reward(latents, prompt=prompt, meta=meta):
            pix = policy.decode(latents).float().clamp(0, 1)
            n = pix.shape[0]
            out = rewards(make_input(pix, [prompt] * n, torch.zeros(n, dtype=torch.long), [dict(meta)] * n))
            return torch.nan_to_num(out.total, nan=float("-inf"))

        sig = eng.sigmas(noise([torch.Generator()]))
        with torch.no_grad():
            r = S.best_of_n(velocity, noise, sig, reward, budget, seed=p)
            bon.append((r.nfe, r.reward))
            for f in fracs:
                d = S.dts_star(velocity, noise, sig, reward, max(steps, int(budget * f)), seed=p, kernel=kern,
                               kernel_cfg=kcfg)
                dts[f].append((d.nfe, d.reward))
    bon_nfe, bon_r = (sum(v) / len(v) for v in zip(*bon))
    curve = [tuple(sum(v) / len(v) for v in zip(*dts[f])) for f in fracs]
    reach = learning_lib.nfe_to_reach(curve, bon_r)
    return {"best_of_n": {"nfe": bon_nfe, "reward": bon_r},
            "dts_star": [{"budget_fraction": f, "nfe": n, "reward": r} for f, (n, r) in zip(fracs, curve)],
            "dts_nfe_to_bestofn": reach / bon_nfe if reach is not None else None,
            "prompts": len(items), "budget": budget}


def main(argv: list[str]) -> dict:
    import torch

    args = parse(argv)
    torch.set_num_threads(args.threads)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = sorted(set(parts) - {"engine", "learning", "search"})
    if bad:
        raise SystemExit(f"unknown part(s) {bad}; choose from engine, learning, search")
    result: dict = {"bench": "trees", "quick": args.quick}
    for part, fn in (("engine", engine), ("learning", learning), ("search", search)):
        if part in parts:
            t0 = time.perf_counter()
            result[part] = fn(args)
            result[part]["seconds"] = round(time.perf_counter() - t0, 1)
    for key, part in (("frontier_cost_ratio", "engine"), ("tree_nfe_to_flat_final", "learning"),
                      ("dts_nfe_to_bestofn", "search")):
        if part in result:
            result[key] = result[part].get(key)
    return result


if __name__ == "__main__":
    import json

    print(json.dumps(main(sys.argv[1:])))
