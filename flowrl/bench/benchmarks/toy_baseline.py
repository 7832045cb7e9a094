"""Baseline of the shipped toy model on held-out shapes prompts: verifier sanity, accuracy, image quality.

    python scripts/bench.py toy-baseline [--n 300] [--steps 20] [--guidance 1.0] [--grid out.png]

1. ``verifier_gt_acc``: strict verifier accuracy on ground-truth renders of the same prompts (should be ≈ 1).
2. The policy samples each prompt once with the deterministic Euler ODE (``samplers.rollout``, diffusers'
   FlowMatchEuler grid) from per-sample noise ``sample_generator(seed, 0, i, 0)``; the strict verifier
   (all checks pass, GenEval-style) and partial credit are averaged over ``--n`` held-out prompts drawn
   balanced over the five skills (``sample_prompts("heldout", n, seed)``), with strict accuracy per skill.
3. ``palette_distance``: mean pixel distance to the nearest background/palette colour (lower is cleaner;
   ground truth ≈ 0.003).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def parse(argv):
    ap = argparse.ArgumentParser(prog="bench.py toy-baseline", description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default=None, help="toy checkpoint directory (default: the shipped one)")
    ap.add_argument("--split", default="heldout", choices=["heldout", "train"])
    ap.add_argument("--n", type=int, default=300, help="prompts, balanced over the five skills")
    ap.add_argument("--steps", type=int, default=20, help="Euler ODE steps")
    ap.add_argument("--guidance", type=float, default=1.0, help="CFG scale (1 = no CFG)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--grid", default=None, help="write an 8-column PNG grid of the first 64 samples here")
    ap.add_argument("--quick", action="store_true", help="check that it runs: 10 prompts, 4 steps")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.steps, args.batch = 10, 4, 10
    return args


@torch.no_grad()
def sample_pixels(policy, prompts: list[str], steps: int, guidance: float, seed: int, batch: int = 100,
                  offset: int = 0) -> torch.Tensor:
    """Pixels (N, 3, 32, 32) in [0, 1] of one deterministic ODE sample per prompt (noise of row i from
    ``sample_generator(seed, 0, offset + i, 0)``)."""
    from samplers.engine import SampleSpec, SamplingEngine
    from samplers.rng import sample_generator

    engine = SamplingEngine(policy, SampleSpec(steps, 32, 32, guidance=guidance, chunk=batch))
    gens = [sample_generator(seed, 0, offset + i, 0) for i in range(len(prompts))]
    return engine.sample(prompts, gens, decode=True).pixels


def save_grid(pixels: torch.Tensor, path: str, cols: int = 8, scale: int = 4) -> None:
    """First ``cols``² images as one PNG grid, nearest-neighbour upscaled ×``scale``."""
    from PIL import Image

    px = pixels[: cols * cols]
    rows = -(-len(px) // cols)
    canvas = torch.zeros(3, rows * 34, cols * 34)
    for i, img in enumerate(px):
        r, c = divmod(i, cols)
        canvas[:, r * 34 + 1: r * 34 + 33, c * 34 + 1: c * 34 + 33] = img
    arr = (canvas.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    Image.fromarray(arr).resize((arr.shape[1] * scale, arr.shape[0] * scale), Image.NEAREST).save(path)


def evaluate(policy, items, steps: int, guidance: float, seed: int, batch: int = 100) -> dict:
    """Strict / partial / per-skill accuracy and palette distance of the policy's samples for ``items``."""
    from flowrl.data.shapes.detect import palette_distance
    from rewards import make_input
    from rewards.shapes import Config, ShapesVerifier

    prompts, metas = [p for p, _ in items], [m for _, m in items]
    pixels = sample_pixels(policy, prompts, steps, guidance, seed, batch)
    out = ShapesVerifier(Config(mode="strict"))(make_input(pixels, prompts, meta=metas))
    per_skill = {}
    for skill in ("color", "counting", "position", "binding", "relation"):
        v = out[f"skill_{skill}"]
        per_skill[skill] = round(float(v[~torch.isnan(v)].mean()), 4)
    return {"strict": round(float(out["strict"].mean()), 4), "partial": round(float(out["partial"].mean()), 4),
            "per_skill": per_skill, "palette_distance": round(float(palette_distance(pixels).mean()), 4),
            "pixels": pixels}


def main(argv=None) -> dict:
    from flowrl.data.shapes.detect import palette_distance
    from flowrl.data.shapes.render import render_batch
    from flowrl.data.shapes.splits import sample_prompts
    from flowrl.policies.toy import ToyPolicy
    from rewards import make_input
    from rewards.shapes import Config, ShapesVerifier

    args = parse(argv or [])
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    items = sample_prompts(args.split, args.n, seed=args.seed)
    prompts, metas = [p for p, _ in items], [m for _, m in items]
    gt = torch.from_numpy(render_batch(metas, seed=args.seed))
    gt_acc = ShapesVerifier(Config(mode="strict"))(make_input(gt, prompts, meta=metas))["strict"].mean()
    policy = ToyPolicy.from_pretrained(args.checkpoint)
    res = evaluate(policy, items, args.steps, args.guidance, args.seed, args.batch)
    if args.grid:
        save_grid(res["pixels"], args.grid)
    return {"bench": "toy-baseline", "verifier_gt_acc": round(float(gt_acc), 4),
            f"{args.split}_strict": res["strict"], f"{args.split}_partial": res["partial"],
            "per_skill": res["per_skill"], "palette_distance": res["palette_distance"],
            "gt_palette_distance": round(float(palette_distance(gt).mean()), 4),
            "n": args.n, "steps": args.steps, "guidance": args.guidance, "seconds": round(time.time() - t0, 1)}
