"""Pretrain the toy text-to-image model of the shapes world from scratch with rectified flow (CPU-friendly).

Objective (Liu et al. 2022 rectified flow; Esser et al. 2024 SD3 §2–3): with x0 = 2·pixels − 1 (pixel space),
ε ~ N(0, I) and σ ~ logit-normal(0, 1) (SD3's default timestep density, σ = sigmoid(u), u ~ N(0, 1)),

    x_σ = (1 − σ)·x0 + σ·ε,   L = ‖v_θ(x_σ, σ, c) − (ε − x0)‖²   (mean over pixels),

with the prompt replaced by "" with probability ``--cfg-dropout`` (so CFG has an unconditional model).
Data are endless fresh renders of training-split prompts (skills balanced). The saved weights are an EMA of
the trained ones. A checkpoint (fp16 safetensors) is written every ``--save-minutes`` and at the end, so a
partial run is usable: ``ToyPolicy.from_pretrained(<out>/checkpoint)``.

    python scripts/pretrain_toy.py --minutes 60 --out /tmp/toy_pretrain
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from flowrl.data.shapes.render import render_batch
from flowrl.data.shapes.splits import sample_prompts
from flowrl.policies.toy_modules import build_modules, ema_update, encode_text, predict_velocity, save_modules, tokenize


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/toy_pretrain", help="run directory (checkpoint/ and log.jsonl)")
    p.add_argument("--steps", type=int, default=100_000, help="stop after this many optimizer steps")
    p.add_argument("--minutes", type=float, default=None, help="stop after this much wall time")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=int, default=100, help="linear learning-rate warm-up steps")
    p.add_argument("--ema", type=float, default=0.995, help="EMA decay of the saved weights")
    p.add_argument("--cfg-dropout", type=float, default=0.1, help="probability of the empty prompt")
    p.add_argument("--preset", default="small", choices=["small", "tiny"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save-minutes", type=float, default=5.0)
    p.add_argument("--log-every", type=int, default=25)
    return p.parse_args(argv)


def training_batch(step: int, args, device="cpu") -> tuple[list[str], torch.Tensor]:
    """Prompts (with CFG dropout applied) and clean latents x0 (B, 3, 32, 32) in [-1, 1] for ``step``."""
    items = sample_prompts("train", args.batch_size, seed=args.seed * 1_000_003 + step)
    pixels = torch.from_numpy(render_batch([m for _, m in items], seed=args.seed * 1_000_003 + step))
    drop = np.random.default_rng([args.seed, step, 7]).random(len(items)) < args.cfg_dropout
    prompts = ["" if d else p for (p, _), d in zip(items, drop)]
    return prompts, (pixels * 2 - 1).to(device)


def rectified_flow_loss(transformer, text_encoder, ids, x0, gen: torch.Generator) -> torch.Tensor:
    """‖v_θ(x_σ, σ, c) − (ε − x0)‖² with σ = sigmoid(N(0, 1)) (logit-normal, SD3 §3.1)."""
    b = x0.shape[0]
    sigma = torch.sigmoid(torch.randn(b, generator=gen))
    eps = torch.randn(x0.shape, generator=gen)
    s = sigma.view(b, 1, 1, 1)
    x_sigma = (1 - s) * x0 + s * eps
    embeds, pooled = encode_text(text_encoder, ids)
    v = predict_velocity(transformer, x_sigma, sigma, embeds, pooled)
    return (v.float() - (eps - x0)).pow(2).mean()


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok, te, tr = build_modules(args.preset, seed=args.seed)
    ema = [copy.deepcopy(te).requires_grad_(False), copy.deepcopy(tr).requires_grad_(False)]
    params = list(te.parameters()) + list(tr.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    info = {"step": 0, "loss_ema": math.nan}

    def save(step: int) -> None:
        info.update(step=step, minutes=round((time.time() - t0) / 60, 2), args=vars(args))
        save_modules(out / "checkpoint", tok, ema[0], ema[1], torch.float16, info)

    with open(out / "log.jsonl", "a") as log:
        step = train_loop(args, tok, te, tr, ema, opt, sched, gen, log, save, info, t0)
    save(step + 1)
    return {"steps": step + 1, "loss_ema": info["loss_ema"], "checkpoint": str(out / "checkpoint")}


def train_loop(args, tok, te, tr, ema, opt, sched, gen, log, save, info, t0) -> int:
    """The optimisation loop; returns the index of the last step taken."""
    params = list(te.parameters()) + list(tr.parameters())
    last_save = t0
    bar = tqdm(range(args.steps), desc="pretrain toy", dynamic_ncols=True)
    step = 0
    for step in bar:
        prompts, x0 = training_batch(step, args)
        loss = rectified_flow_loss(tr, te, tokenize(tok, prompts), x0, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        ema_update(ema, [te, tr], min(args.ema, (1 + step) / (10 + step)))
        le = info["loss_ema"]
        info["loss_ema"] = loss.item() if math.isnan(le) else 0.98 * le + 0.02 * loss.item()
        bar.set_postfix(loss=f"{info['loss_ema']:.4f}")
        if step % args.log_every == 0:
            log.write(json.dumps({"step": step, "loss": loss.item(), "loss_ema": info["loss_ema"],
                                  "sec": round(time.time() - t0, 1)}) + "\n")
            log.flush()
        if time.time() - last_save > 60 * args.save_minutes:
            save(step + 1)
            last_save = time.time()
        if args.minutes is not None and time.time() - t0 > 60 * args.minutes:
            break
    return step


if __name__ == "__main__":
    print(json.dumps(main()))
