"""Samplers benchmark: the flowrl rollout engine vs diffusers' StableDiffusion3Pipeline call, same model, same
prompt embeddings, same starting latents and NFE, side by side in one run.

    python scripts/bench.py samplers [--layers 4 --heads 8 --head-dim 32 --latent 32 --batch 2 --steps 10]

The model is an SD3 MMDiT built from config objects (no download) on the tiny SD3 text stack; the pipeline and
the flowrl SD3Policy share the very same component objects. Prints
``{"bench": "samplers", "ode_ratio": …, "sde_ratio": …, "sde_peak_mem_ratio": …, ...}``:
  ode_ratio   flowrl ODE rollout time / pipeline call time (target ≤ 1.03): process CPU time of the fastest of
              --repeats alternated runs, single-threaded, so other jobs on a shared CPU do not skew it
              (``ode_ratio_wall``: the same with wall time)
  sde_ratio   flowrl Flow-GRPO SDE rollout recording a trajectory (FG-Fast window of 2 steps) / pipeline time
  *_peak_mb   peak RSS increase of one call over the RSS just before it, each measured in a fresh subprocess
              (``resource.getrusage(...).ru_maxrss``; large CPU tensors are mmap'd, so RSS tracks them)
  sde_peak_mem_ratio  SDE-with-trajectory peak / pipeline peak (target ≤ 1.1)
  engine_*    CPU ms the engine itself adds per step (identity velocity), next to ``pipeline_ms_per_step``
The ODE latents must equal the pipeline's (``ode_max_abs_diff``).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time

import torch

from flowrl.bench.paths import REPO


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--latent", type=int, default=32, help="latent height = width (tokens = (latent/2)²)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--guidance", type=float, default=4.5)
    ap.add_argument("--window", type=int, default=2, help="stored SDE steps of the trajectory rollout")
    ap.add_argument("--repeats", type=int, default=3, help="fastest of this many alternated runs per path")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (1: steady timings on a shared machine)")
    ap.add_argument("--no-memory", action="store_true", help="skip the subprocess peak-memory measurement")
    ap.add_argument("--measure", choices=["pipeline", "sde", "ode"], help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="check that it runs: 1 layer, 16×16 latents, 2 steps, once")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.latent, args.steps, args.window, args.repeats = 1, 16, 2, 1, 1
    return args


def build(args):
    """SD3Policy (no LoRA) around a config-built MMDiT, its pipeline on the same components, prompts encoded."""
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

    from flowrl.policies.sd3 import Config, SD3Policy
    from flowrl.policies.tiny import sd3_components

    parts = sd3_components(0)
    torch.manual_seed(0)
    d = args.heads * args.head_dim
    parts["transformer"] = SD3Transformer2DModel(
        sample_size=args.latent, patch_size=2, in_channels=4, out_channels=4, num_layers=args.layers,
        attention_head_dim=args.head_dim, num_attention_heads=args.heads, caption_projection_dim=d,
        joint_attention_dim=32, pooled_projection_dim=64)
    policy = SD3Policy(parts, Config(lora=None, keep_base=False, max_sequence_length=16), "cpu", torch.float32)
    pipe = StableDiffusion3Pipeline(**policy.pipe.components)
    pipe.set_progress_bar_config(disable=True)
    prompts = ["a red circle left of a blue square", "a photo of a cat", "two dogs", "a green apple"]
    cond = policy.encode((prompts * args.batch)[:args.batch], cfg=args.guidance > 1)
    return policy, pipe, cond


def noise(policy, args):
    from samplers.rng import sample_generator

    gens = [sample_generator(0, 0, 0, i) for i in range(args.batch)]
    size = args.latent * policy.vae_scale_factor
    return policy.noise(gens, size, size), gens


def run_pipeline(pipe, cond, x1, args):
    u = cond.uncond or {}
    return pipe(prompt_embeds=cond.embeds["prompt_embeds"], pooled_prompt_embeds=cond.embeds["pooled_prompt_embeds"],
                negative_prompt_embeds=u.get("prompt_embeds"),
                negative_pooled_prompt_embeds=u.get("pooled_prompt_embeds"),
                latents=x1.clone(), num_inference_steps=args.steps, guidance_scale=args.guidance,
                output_type="latent").images


def run_flowrl(policy, cond, x1, gens, args, sde: bool):
    from samplers import KERNELS
    from samplers.rollout import rollout
    from samplers.windows import RandomWindow

    sigmas = policy.sigmas(args.steps, x1)
    plan, kernel = None, "ode"
    if sde:
        plan = RandomWindow(args.window, (0, max(args.steps // 2, args.window))).plan(0, args.steps, random.Random(0))
        kernel = KERNELS.get("flow_sde")
    return rollout(lambda x, s: policy.velocity(x, s, cond, args.guidance), x1, sigmas, plan, kernel, None, gens)


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def engine_overhead_ms(x1, gens, args, steps: int = 200) -> dict:
    """CPU ms per step the rollout engine itself costs (velocity = identity, same latent shape): ODE, and an
    SDE rollout storing a 2-step window (per-row noise draws, kernel, log-prob, trajectory writes)."""
    from samplers import KERNELS
    from samplers.rollout import rollout
    from samplers.schedule import flow_match_sigmas
    from samplers.windows import StepPlan

    grid = flow_match_sigmas(steps, shift=3.0)
    plan = StepPlan(steps, (10, 11))
    ode = min(timed(lambda: rollout(lambda x, s: x, x1, grid))[1] for _ in range(3))
    sde = min(timed(lambda: rollout(lambda x, s: x, x1, grid, plan, KERNELS.get("flow_sde"), None, gens))[1]
              for _ in range(3))
    return {"engine_ode_ms_per_step": 1e3 * ode / steps, "engine_sde_extra_ms_per_stored_step":
            1e3 * max(sde - ode, 0.0) / len(plan.sde_steps)}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure_peak(args) -> dict:
    """In this (fresh) process: RSS before one call and the peak RSS during it, in MB."""
    policy, pipe, cond = build(args)
    x1, gens = noise(policy, args)
    with torch.no_grad():
        before, peak_before = rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if args.measure == "pipeline":
            run_pipeline(pipe, cond, x1, args)
        else:
            run_flowrl(policy, cond, x1, gens, args, sde=args.measure == "sde")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"rss_before_mb": before, "peak_before_mb": peak_before, "peak_mb": peak, "delta_mb": peak - before}


def subprocess_peak(mode: str, argv: list[str]) -> dict:
    cmd = [sys.executable, "-m", "flowrl.bench.benchmarks.samplers", *argv, "--measure", mode]  # a fresh process
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": path})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> dict:
    args = parse(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.measure:
        return measure_peak(args)
    policy, pipe, cond = build(args)
    x1, gens = noise(policy, args)
    times = {"pipeline": [], "ode": [], "sde": []}
    with torch.no_grad():
        ref = run_pipeline(pipe, cond, x1, args)            # warm-up, and the parity reference
        ode = run_flowrl(policy, cond, x1, gens, args, sde=False)
        for _ in range(args.repeats):
            times["pipeline"].append(timed(lambda: run_pipeline(pipe, cond, x1, args)))
            times["ode"].append(timed(lambda: run_flowrl(policy, cond, x1, gens, args, sde=False)))
            times["sde"].append(timed(lambda: run_flowrl(policy, cond, *noise(policy, args), args, sde=True)))
    cpu = {k: min(t[1] for t in v) for k, v in times.items()}
    wall = {k: min(t[0] for t in v) for k, v in times.items()}
    result = {
        "bench": "samplers",
        "model": f"SD3 MMDiT {args.layers}L×{args.heads}h×{args.head_dim}, "
                 f"{(args.latent // 2) ** 2} image tokens, batch {args.batch}, CFG {args.guidance}",
        "steps": args.steps, "threads": torch.get_num_threads(),
        "ode_ratio": cpu["ode"] / cpu["pipeline"], "sde_ratio": cpu["sde"] / cpu["pipeline"],
        "ode_ratio_wall": wall["ode"] / wall["pipeline"], "sde_ratio_wall": wall["sde"] / wall["pipeline"],
        "pipeline_cpu_s": cpu["pipeline"], "ode_cpu_s": cpu["ode"], "sde_cpu_s": cpu["sde"],
        "pipeline_wall_s": wall["pipeline"],
        "ode_max_abs_diff": float((ode.latents - ref.float()).abs().max()),
        "timing": f"fastest of {args.repeats} alternated runs each; ratios of process CPU time (1 thread), "
                  "which other jobs on a shared machine do not inflate; *_wall ratios alongside",
    }
    result.update(engine_overhead_ms(x1, gens, args))
    result["pipeline_ms_per_step"] = 1e3 * cpu["pipeline"] / args.steps
    if not args.no_memory:
        child = [a for a in argv]
        pipe_mem, sde_mem = subprocess_peak("pipeline", child), subprocess_peak("sde", child)
        result.update({"pipeline_peak_mb": pipe_mem["delta_mb"], "sde_peak_mb": sde_mem["delta_mb"],
                       "sde_peak_mem_ratio": sde_mem["delta_mb"] / pipe_mem["delta_mb"],
                       "sde_stored_steps": args.window,
                       "memory_method": "peak RSS (ru_maxrss) minus RSS before the call, fresh subprocess per mode"})
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
