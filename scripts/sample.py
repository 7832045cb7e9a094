#!/usr/bin/env python
"""Search without training: best-of-N and DTS / DTS* at equal NFE on any policy and reward (samplers.search).

    # the shipped toy model, 4 held-out prompts, shapes verifier, 64 velocity evaluations per prompt
    # (CPU, ~20 s)
    python scripts/sample.py --policy toy --reward shapes --num-prompts 4 --budget 64 --out runs/search

    # a real model and reward, DTS at λ = 10 against best-of-N
    python scripts/sample.py --policy sd3 --reward pickscore --prompts prompts.txt --methods best_of_n,dts \\
        --lam 10 --budget 400 --steps 20 --out runs/sd3_search

For each prompt and method the returned sample is decoded and scored with the reward set's weighted total.
Methods: ``ode`` (one ODE sample, NFE = steps), ``best_of_n`` (⌊budget/steps⌋ ODE samples, the best kept),
``dts`` (soft value, λ = --lam, returns a draw ∝ exp(λ·v̂) and the best seen), ``dts_star`` (greedy, max
backup, the best leaf). All methods start from the same root noises (``--seed``). Prints a JSON summary; with
--out also writes results.jsonl (one line per prompt × method), <method>/p0000.png and command.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

METHODS = ("ode", "best_of_n", "dts", "dts_star")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SIZE = {"toy": 32, "sd3": 512, "flux": 512}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="toy", help="policy family (toy, sd3, flux, qwen_image, ...)")
    ap.add_argument("--path", help="weights: local dir or hub id (default: the family default; toy: shipped)")
    ap.add_argument("--tiny", action="store_true", help="the family's tiny random preset (smoke runs)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reward", default="shapes",
                    help="comma-separated reward names (REWARDS or module:attr)")
    ap.add_argument("--prompts", default="shapes:heldout",
                    help="heldout | train | shapes:<split> | FILE.txt | FILE.jsonl")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--methods", default="ode,best_of_n,dts_star", help=f"comma-separated, of {METHODS}")
    ap.add_argument("--budget", type=int, default=64, help="velocity evaluations per prompt and method")
    ap.add_argument("--steps", type=int, default=8, help="denoising steps")
    ap.add_argument("--lam", type=float, default=10.0, help="DTS λ (target p·exp(λ·r))")
    ap.add_argument("--max-children", type=int, default=8, help="DTS widening bound per node")
    ap.add_argument("--kernel", default="flow_sde", help="SDE kernel of the DTS expansions")
    ap.add_argument("--noise-level", type=float,
                    help="SDE noise level (default: the policy's, else the kernel's)")
    ap.add_argument("--guidance", type=float, help="CFG / distilled guidance (default: the policy's)")
    ap.add_argument("--size", type=int, help="image height = width (default: the family's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="output directory (results.jsonl, PNGs, command.json)")
    args = ap.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        ap.error(f"unknown method(s) {bad}; choose from {METHODS}")
    return args


def build_policy(args: argparse.Namespace):
    from flowrl.policies import POLICIES

    cls = POLICIES.get(args.policy)
    if args.tiny:
        return cls.tiny(seed=args.seed, device=args.device)
    kwargs = {"dtype": DTYPES[args.dtype], "device": args.device}
    if args.path:
        kwargs["path"] = args.path
    return cls.from_pretrained(**kwargs)


def reward_of(rewards, policy, prompt: str, meta: dict):
    """latents (B, ...) → the reward set's weighted total (B,) for this prompt."""
    from dataclasses import replace

    from flowrl.data.images import source_images
    from rewards.base import make_input

    sources = source_images([meta])

    def score(latents: torch.Tensor) -> torch.Tensor:
        pixels = policy.decode(latents).float().clamp(0, 1)
        n = pixels.shape[0]
        batch = make_input(pixels, [prompt] * n, torch.zeros(n, dtype=torch.long), [dict(meta)] * n)
        batch = replace(batch, images=None if sources is None else sources * n)
        total = rewards(batch).total
        return torch.nan_to_num(total, nan=float("-inf"))
    return score


def run_method(method: str, args, policy, prompt: str, meta: dict, rewards, kernel_cfg):
    """One search on one prompt; returns (SearchResult, seconds)."""
    from samplers import search
    from samplers.engine import SampleSpec, SamplingEngine

    w = policy.default_guidance if args.guidance is None else args.guidance
    size = args.size or SIZE.get(args.policy, 512)
    engine = SamplingEngine(policy, SampleSpec(args.steps, size, size, guidance=w))
    from flowrl.data.images import source_images

    cond = engine.encode([prompt], images=source_images([meta]))     # a prompt's source image(s), if any

    def velocity(x, sigma):
        return policy.velocity(x, sigma, cond.select([0] * x.shape[0]), w)

    noise = engine.noise
    sigmas = engine.sigmas(noise([torch.Generator()]))
    reward, budget = reward_of(rewards, policy, prompt, meta), args.budget
    cfg = search.DTSConfig(lam=args.lam, max_children=args.max_children)
    start = time.perf_counter()
    with torch.no_grad():
        if method == "ode":
            res = search.best_of_n(velocity, noise, sigmas, reward, args.steps, args.seed)
        elif method == "best_of_n":
            res = search.best_of_n(velocity, noise, sigmas, reward, budget, args.seed)
        else:
            fn = search.dts if method == "dts" else search.dts_star
            res = fn(velocity, noise, sigmas, reward, budget, cfg, args.seed, args.kernel, kernel_cfg)
    return res, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    from flowrl.data.prompts import load_prompts
    from rewards import RewardSet
    from samplers import KERNELS

    policy = build_policy(args)
    source = {"heldout": "shapes:heldout", "train": "shapes:train"}.get(args.prompts, args.prompts)
    items = load_prompts(source, args.seed).fixed(args.num_prompts)
    rewards = RewardSet({n.strip(): 1.0 for n in args.reward.split(",") if n.strip()}, device=args.device)
    kern = KERNELS.get(args.kernel)
    level = args.noise_level if args.noise_level is not None else getattr(policy.config, "noise_level", None)
    has_level = "noise_level" in kern.Config.__dataclass_fields__
    kernel_cfg = kern.config(noise_level=level) if (level is not None and has_level) else kern.Config()
    out = Path(args.out) if args.out else None
    rows, summary = [], {}
    for p, (prompt, meta) in enumerate(items):
        for method in args.methods:
            res, secs = run_method(method, args, policy, prompt, meta, rewards, kernel_cfg)
            rows.append({"prompt_idx": p, "prompt": prompt, "method": method, "reward": res.reward,
                         "best_reward": res.best_reward, "nfe": res.nfe, "samples": res.samples,
                         "seconds": secs})
            if out is not None:
                _save(out / method / f"p{p:04d}.png", policy.decode(res.latents)[0])
    for method in args.methods:
        mine = [r for r in rows if r["method"] == method]
        keys = ("reward", "best_reward", "nfe", "seconds")
        summary[method] = {k: sum(r[k] for r in mine) / len(mine) for k in keys}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / "command.json").write_text(json.dumps({"argv": sys.argv[1:] if argv is None else list(argv),
                                                       **{k: v for k, v in vars(args).items()}}, indent=1))
    print(json.dumps(summary, indent=1))
    return summary


def _save(path: Path, pixels: torch.Tensor) -> None:
    from flowrl.eval.grid import to_uint8
    from flowrl.eval.media import save_png

    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(to_uint8(pixels.float()), path)


if __name__ == "__main__":
    main()
