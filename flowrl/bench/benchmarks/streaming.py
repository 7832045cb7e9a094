"""Streaming benchmark: chunk-by-chunk generation with the KV cache vs recomputing the full block-causal pass
at every chunk (no cache), same randomly initialised causal Wan, same noise, one run.

    python scripts/bench.py streaming [--layers 4 --heads 4 --head-dim 32 --frames 21 --latent 16 --device cpu]

Both paths use deterministic ODE re-noising so they must produce the same video (``max_abs_diff``).
The no-cache baseline denoises chunk k by running the masked model over [clean chunks < k at t = 0 | chunk k],
which is what a causal model without a cache has to do. Prints ``{"bench": "streaming", "cache_ratio": …,
"chunk_latency_s": …, ...}``; ``cache_ratio`` = cached time / recompute time (target ≤ 0.5).
"""
from __future__ import annotations

import argparse
import time

import torch


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--frames", type=int, default=21, help="latent frames (21 = Wan's 81 pixel frames)")
    ap.add_argument("--latent", type=int, default=24, help="latent height = width (tokens/frame = (latent/2)²)")
    ap.add_argument("--chunk", type=int, default=3)
    ap.add_argument("--steps", default="self_forcing")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=3, help="take the fastest of this many runs of each path")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads (1: steady timings on a shared machine; 0: torch's default)")
    ap.add_argument("--quick", action="store_true", help="check that it runs: 1 layer, 6 frames of 8×8, once")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.frames, args.latent, args.repeats = 1, 6, 8, 1
    return args


def build(args):
    from flowrl.distill.causal_wan import CausalWan
    from flowrl.distill.components import tiny_wan

    d = args.heads * args.head_dim
    tr = tiny_wan(0, num_attention_heads=args.heads, attention_head_dim=args.head_dim, ffn_dim=4 * d,
                  num_layers=args.layers, rope_max_seq_len=1024)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    tr = tr.to(args.device) if dtype == torch.float32 else tr.to(args.device, dtype)
    return CausalWan(tr, chunk_frames=args.chunk)


@torch.no_grad()
def generate_cached(model, noise, text, ts) -> tuple[torch.Tensor, list[float]]:
    from flowrl.distill.rollout import stream_chunks

    out, times = [], []
    last = time.perf_counter()
    for x0 in stream_chunks(model, noise, text, ts, renoise_kind="ode"):
        _sync(noise.device)
        now = time.perf_counter()
        times.append(now - last)
        out.append(x0)
        last = time.perf_counter()
    return torch.cat(out, dim=2), times


@torch.no_grad()
def generate_recompute(model, noise, text, ts) -> torch.Tensor:
    """No cache: every denoising step of chunk k re-runs the block-causal model over all previous clean chunks."""
    from flowrl.distill.rollout import chunk_slices, renoise

    b = noise.shape[0]
    clean = noise[:, :, :0]
    steps = [float(t) for t in ts]
    for sl in chunk_slices(noise.shape[2], model.chunk_frames):
        x = noise[:, :, sl]
        n_ctx, n = clean.shape[2], sl.stop - sl.start
        for i, t in enumerate(steps):
            tt = torch.tensor([0.0] * n_ctx + [t] * n, device=noise.device).expand(b, -1)
            v = model(torch.cat([clean, x], dim=2), tt, text)[:, :, n_ctx:]
            if i == len(steps) - 1:
                x = x - t / 1000 * v
            else:
                x = renoise(x, v, t / 1000, steps[i + 1] / 1000, "ode")
        clean = torch.cat([clean, x], dim=2)
    return clean


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn):
    """(result, wall seconds, process CPU seconds): CPU time is the steadier figure on a shared machine."""
    _sync(DEVICE[0])
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    _sync(DEVICE[0])
    return out, time.perf_counter() - t0, time.process_time() - c0


DEVICE = ["cpu"]


def main(argv: list[str]) -> dict:
    from flowrl.distill.schedule import denoising_timesteps

    args = parse(argv)
    DEVICE[0] = args.device
    if args.device == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    model = build(args)
    dtype = next(model.parameters()).dtype
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(1, 16, args.frames, args.latent, args.latent, generator=g).to(args.device, dtype)
    text = torch.randn(1, 16, 32, generator=g).to(args.device, dtype)
    ts = denoising_timesteps(args.steps)
    small = noise[:, :, : 2 * args.chunk]
    generate_cached(model, small, text, ts)              # warm-up (allocator, kernels)
    generate_recompute(model, small, text, ts)
    best_c, best_r, cpu_c, cpu_r, chunk_times = float("inf"), float("inf"), float("inf"), float("inf"), []
    for _ in range(args.repeats):
        (vid_c, times), t_c, p_c = _timed(lambda: generate_cached(model, noise, text, ts))
        vid_r, t_r, p_r = _timed(lambda: generate_recompute(model, noise, text, ts))
        if t_c < best_c:
            best_c, chunk_times = t_c, times
        best_r, cpu_c, cpu_r = min(best_r, t_r), min(cpu_c, p_c), min(cpu_r, p_r)
    tokens_per_frame = (args.latent // 2) ** 2
    return {"bench": "streaming", "cache_ratio": round(best_c / best_r, 4),
            "chunk_latency_s": round(sum(chunk_times) / len(chunk_times), 5),
            "first_chunk_latency_s": round(chunk_times[0], 5),
            "cache_ratio_cpu": round(cpu_c / cpu_r, 4) if args.device == "cpu" else None,
            "cached_s": round(best_c, 4), "recompute_s": round(best_r, 4),
            "max_abs_diff": float((vid_c.float() - vid_r.float()).abs().max()),
            "chunks": len(chunk_times), "tokens": tokens_per_frame * args.frames, "device": args.device,
            "config": {"layers": args.layers, "dim": args.heads * args.head_dim, "frames": args.frames,
                       "tokens_per_frame": tokens_per_frame, "chunk": args.chunk, "steps": len(ts),
                       "dtype": args.dtype}}


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(main(sys.argv[1:])))
