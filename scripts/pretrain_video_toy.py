"""Pretrain the tiny video teacher of the moving-shapes world from scratch with rectified flow (CPU-friendly,
resumable).

Objective (Liu et al. 2022 rectified flow; Esser et al. 2024 SD3 §2–3), as scripts/pretrain_toy.py: with
x0 = 2·video − 1 laid out (3, F, H, W) (pixel space), ε ~ N(0, I) and σ = sigmoid(u), u ~ N(0, 1),

    x_σ = (1 − σ)·x0 + σ·ε,   L = ‖v_θ(x_σ, σ, c) − (ε − x0)‖²   (mean over pixels),

with the prompt replaced by "" with probability ``--cfg-dropout``. Data are endless fresh clips of training-split
prompts (skills balanced); step s's batch is a pure function of (seed, s). The saved weights are an EMA. Every
``--save-minutes`` and at the end it writes ``<out>/checkpoint/`` (fp16 safetensors: load with
``VideoToyPolicy.from_pretrained(<out>/checkpoint)``) and ``<out>/state.pt`` (fp32 weights, EMA, optimizer, RNG),
from which a rerun with the same ``--out`` resumes exactly where it stopped.

    python scripts/pretrain_video_toy.py --minutes 60 --threads 1 --out runs/video_toy_pretrain
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

from flowrl.data.video_shapes.render import render_batch
from flowrl.data.video_shapes.splits import sample_prompts
from flowrl.policies import toy_video_modules as tvm
from flowrl.policies.toy_modules import ema_update


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/video_toy_pretrain", help="run directory (checkpoint/, state.pt, log.jsonl)")
    p.add_argument("--steps", type=int, default=100_000, help="stop after this many optimizer steps in all")
    p.add_argument("--minutes", type=float, default=None, help="stop after this much wall time (this invocation)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=int, default=100, help="linear learning-rate warm-up steps")
    p.add_argument("--ema", type=float, default=0.995, help="EMA decay of the saved weights")
    p.add_argument("--cfg-dropout", type=float, default=0.1, help="probability of the empty prompt")
    p.add_argument("--preset", default="small", choices=sorted(tvm.PRESETS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 on a shared CPU)")
    p.add_argument("--save-minutes", type=float, default=5.0)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--no-resume", action="store_true", help="start afresh even if <out>/state.pt exists")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        p.error(f"--steps and --batch-size must be ≥ 1, got {args.steps} and {args.batch_size}")
    return args


def training_batch(step: int, args, device="cpu") -> tuple[list[str], torch.Tensor]:
    """Prompts (CFG dropout applied) and clean latents x0 (B, 3, F, H, W) in [−1, 1] for ``step``."""
    seed = args.seed * 1_000_003 + step
    items = sample_prompts("train", args.batch_size, seed=seed)
    video = torch.from_numpy(render_batch([m for _, m in items], seed=seed, frames=args.frames, size=args.size))
    drop = np.random.default_rng([args.seed, step, 7]).random(len(items)) < args.cfg_dropout
    prompts = ["" if d else p for (p, _), d in zip(items, drop)]
    return prompts, (video.permute(0, 2, 1, 3, 4) * 2 - 1).to(device)


def rectified_flow_loss(transformer, text_encoder, ids, x0, gen: torch.Generator) -> torch.Tensor:
    """‖v_θ(x_σ, σ, c) − (ε − x0)‖² with σ = sigmoid(N(0, 1)) (logit-normal, SD3 §3.1)."""
    b = x0.shape[0]
    sigma = torch.sigmoid(torch.randn(b, generator=gen))
    eps = torch.randn(x0.shape, generator=gen)
    s = sigma.view(b, 1, 1, 1, 1)
    v = tvm.predict_velocity(transformer, (1 - s) * x0 + s * eps, sigma, tvm.encode_text(text_encoder, ids))
    return (v.float() - (eps - x0)).pow(2).mean()


class Run:
    """The modules, EMA copies, optimizer, schedule and RNG of one pretraining run, with exact save/restore."""

    def __init__(self, args):
        self.args = args
        self.tok, self.te, self.tr = tvm.build_modules(args.preset, seed=args.seed)
        self.te.train()
        self.tr.train()
        self.ema = [copy.deepcopy(self.te).requires_grad_(False), copy.deepcopy(self.tr).requires_grad_(False)]
        self.params = list(self.te.parameters()) + list(self.tr.parameters())
        self.opt = torch.optim.AdamW(self.params, lr=args.lr, weight_decay=0.0)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
        self.gen = torch.Generator().manual_seed(args.seed)
        self.step, self.loss_ema, self.seconds = 0, math.nan, 0.0

    def state_dict(self) -> dict:
        return {"te": self.te.state_dict(), "tr": self.tr.state_dict(), "ema_te": self.ema[0].state_dict(),
                "ema_tr": self.ema[1].state_dict(), "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                "gen": self.gen.get_state(), "step": self.step, "loss_ema": self.loss_ema, "seconds": self.seconds,
                "args": {k: v for k, v in vars(self.args).items() if k in ("preset", "seed", "batch_size", "frames",
                                                                             "size", "lr", "warmup", "ema")}}

    def load_state_dict(self, st: dict) -> None:
        mine = self.state_dict()["args"]
        if st["args"] != mine:
            raise ValueError(f"state.pt was written with {st['args']}, this run asks for {mine}; pass the same "
                             "options, another --out, or --no-resume")
        for mod, key in ((self.te, "te"), (self.tr, "tr"), (self.ema[0], "ema_te"), (self.ema[1], "ema_tr")):
            mod.load_state_dict(st[key])
        self.opt.load_state_dict(st["opt"])
        self.sched.load_state_dict(st["sched"])
        self.gen.set_state(st["gen"])
        self.step, self.loss_ema, self.seconds = st["step"], st["loss_ema"], st["seconds"]

    def train_step(self) -> float:
        prompts, x0 = training_batch(self.step, self.args)
        loss = rectified_flow_loss(self.tr, self.te, tvm.tokenize(self.tok, prompts), x0, self.gen)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.sched.step()
        ema_update(self.ema, [self.te, self.tr], min(self.args.ema, (1 + self.step) / (10 + self.step)))
        value = loss.item()
        self.loss_ema = value if math.isnan(self.loss_ema) else 0.98 * self.loss_ema + 0.02 * value
        self.step += 1
        return value

    def save(self, out: Path) -> None:
        info = {"step": self.step, "loss_ema": self.loss_ema, "minutes": round(self.seconds / 60, 2),
                "args": vars(self.args)}
        tvm.save_modules(out / "checkpoint", self.tok, self.ema[0], self.ema[1], torch.float16, info)
        tmp = out / "state.pt.tmp"
        torch.save(self.state_dict(), tmp)
        tmp.replace(out / "state.pt")


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = Run(args)
    if (out / "state.pt").is_file() and not args.no_resume:
        run.load_state_dict(torch.load(out / "state.pt", weights_only=False))
    t0 = last_save = time.time()
    seconds0, step0 = run.seconds, run.step
    with open(out / "log.jsonl", "a") as log:
        bar = tqdm(total=args.steps, initial=run.step, desc="pretrain video toy", dynamic_ncols=True)
        while run.step < args.steps:
            loss = run.train_step()
            run.seconds = seconds0 + time.time() - t0
            bar.update(1)
            bar.set_postfix(loss=f"{run.loss_ema:.4f}")
            if (run.step - 1) % args.log_every == 0:
                log.write(json.dumps({"step": run.step - 1, "loss": loss, "loss_ema": run.loss_ema,
                                      "sec": round(run.seconds, 1)}) + "\n")
                log.flush()
            if time.time() - last_save > 60 * args.save_minutes:
                run.save(out)
                last_save = time.time()
            if args.minutes is not None and time.time() - t0 > 60 * args.minutes:
                break
        bar.close()
    run.save(out)
    done = run.step - step0
    return {"steps": run.step, "loss_ema": run.loss_ema, "steps_per_s": done / max(time.time() - t0, 1e-9),
            "checkpoint": str(out / "checkpoint")}


if __name__ == "__main__":
    print(json.dumps(main()))
