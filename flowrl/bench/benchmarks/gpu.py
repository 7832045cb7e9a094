"""GPU readiness in one command: full-size SD3.5-Medium, FLUX.1-dev, Wan2.1-1.3B and Qwen-Image transformers with
random weights.

    python scripts/bench.py gpu                      # one JSON line; sized for < 8 min on one H200
    python scripts/bench.py gpu --families flux --steps 4
    python scripts/bench.py gpu --families flux2_klein,zimage --no-streaming   # the 2026 families (gpu_families.py)
    python scripts/bench.py gpu --families wan22,hunyuan15 --no-streaming   # the 2026 video families (opt-in)
    python scripts/bench.py gpu --families ltx2 --no-streaming        # LTX-2 19B, video + audio (gpu_ltx2.py)

``wan22`` builds both Wan2.2-T2V-A14B experts (2 × 14.3B, boundary 0.875; LoRA on the high-noise expert, the
policy's default) at 480×832×33; ``hunyuan15`` HunyuanVideo-1.5 (8.3B) at 480×848×33 with its guider's CFG 6.0.
``ltx2`` LTX-2 (18.9B, joint video + audio) at 512×768×121 with its four-call
guidance (``flowrl/bench/gpu_ltx2.py``). All three are opt-in: the default run keeps its 8-minute size.

Not yet run on a GPU (written and smoke-tested at ``--scale tiny`` on CPU); the sizes below are chosen to fit the
8-minute target and ``--budget-s`` (default 420) skips, and names, every part not started by then.

Without a CUDA device it prints ``{"bench": "gpu", "skipped": "no CUDA device"}`` and exits 0.

What it builds: each transformer from its published ``config.json`` (copied into ``configs/gpu/*.json``; sources in
``tests/test_gpu_bench.py``), instantiated on the GPU with random weights (no download) and cast to bf16 (the class'
``_keep_in_fp32_modules`` stay float32, as ``from_pretrained`` keeps them). The text
encoders are *tiny random* models (one layer) with the real output widths (CLIP 768/1280 pooled, T5/UMT5 4096,
Qwen2.5-VL 3584), the
VAEs tiny ones with the real latent factors, tokenizers trained offline (``flowrl.policies.tiny``): only the
transformer matters for throughput, and nothing is decoded (latents out). Random weights make the images noise;
``rel_diff`` is a sanity check, not a quality figure.

What it measures per family (wall seconds with ``cuda.synchronize``, peak allocated GiB per part, one warm-up each):

* ``pipeline``: the stock diffusers pipeline call (``output_type="latent"``) on the same components, LoRA disabled;
* ``flowrl_base``: flowrl's Euler ODE rollout (``flowrl.eval.sample.ode_sample``) with adapters disabled — the same
  weights and latents as ``pipeline``; ``rel_diff`` = max|Δ| / max|pipeline| of the final latents;
* ``flowrl_lora``: the same rollout with the "old" LoRA adapter active under bf16 autocast (a training rollout);
* ``grpo_step``: one Flow-GRPO optimizer step (AdamW on the "train" LoRA): a ``flow_sde`` rollout storing one SDE
  step, then loss (+ KL forward to the base) / backward / step on that stored step;
* ``nft_step``: one DiffusionNFT optimizer step on the ``flowrl_lora`` latents (old, train and base forwards);
  both steps use the objectives' default Configs, the family's default LoRA, Wan with gradient checkpointing;

and ``streaming``: the causal Wan2.1-1.3B student (``flowrl.distill.causal_wan``) generating 21 latent frames
(81 video frames) at 480×832 chunk by chunk (3 frames) with its KV cache, 4 self-forcing steps: ``fps`` =
video frames / seconds (VAE decode excluded). Defaults: SD3.5 / FLUX 512×512, batch 2; Wan 480×832×33, batch 1;
Qwen-Image 512×512, batch 1, gradient checkpointing (its recipe's); 10 sampling steps; CFG per family default (SD3
4.5 → doubled batch, FLUX distilled 3.5, Wan 5.0 → 2 forwards, Qwen-Image norm-rescaled true CFG 4.0 → 2 forwards).
``--scale tiny`` shrinks every config (same classes and code path) for a CPU smoke run.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from contextlib import nullcontext

import torch

from flowrl.bench import gpu_families as new
from flowrl.bench import gpu_ltx2 as ltx2
from flowrl.bench.gpu_encoders import clip_encoder, family_vae, hunyuan_text, t5_encoder
from flowrl.bench.paths import REPO

CONFIG_DIR = REPO / "configs" / "gpu"
CONFIGS = {"sd3": "sd35_medium_transformer.json", "flux": "flux1_dev_transformer.json",
           "wan": "wan21_t2v_1.3b_transformer.json", "qwen_image": "qwen_image_transformer.json",
           "wan22": "wan22_t2v_a14b_transformer.json", "wan22_i2v": "wan22_i2v_a14b_transformer.json",
           "wan22_ti2v": "wan22_ti2v_5b_transformer.json", "hunyuan15": "hunyuan15_480p_t2v_transformer.json",
           "ltx2": ltx2.CONFIG, **new.CONFIGS}
# benched families (wan22: both A14B experts, boundary 0.875)
FAMILIES = ("sd3", "flux", "wan", "qwen_image", *new.CONFIGS, "wan22", "hunyuan15", "ltx2")
# family: (height, width, frames, batch) at full scale / tiny scale
GEOMETRY = {"full": {"sd3": (512, 512, None, 2), "flux": (512, 512, None, 2), "wan": (480, 832, 33, 1),
                     "qwen_image": (512, 512, None, 1), "wan22": (480, 832, 33, 1), "hunyuan15": (480, 848, 33, 1)},
            "tiny": {"sd3": (32, 32, None, 2), "flux": (32, 32, None, 2), "wan": (32, 32, 5, 1),
                     "qwen_image": (32, 32, None, 1), "wan22": (32, 32, 5, 1), "hunyuan15": (32, 32, 5, 1)}}
for _scale in GEOMETRY:
    GEOMETRY[_scale].update(new.GEOMETRY[_scale], ltx2=ltx2.GEOMETRY[_scale])
PROMPTS = ["a red circle left of a blue square", "a photo of a cat", "a dog", "a tree"]
# flow_sde `a` of the recipes (Flow-GRPO: 0.7 SD3.5, 0.9 FLUX; Flow-Factory Qwen-Image 1.0, Wan2.2 0.9;
# HunyuanVideo-1.5: no anchor, 0.7)
NOISE_LEVEL = {"sd3": 0.7, "flux": 0.9, "wan": 0.7, "qwen_image": 1.0, "wan22": 0.9, "hunyuan15": 0.7,
               "ltx2": ltx2.NOISE_LEVEL, **new.NOISE_LEVEL}
CHECKPOINTED = ("wan", "qwen_image", "wan22", "hunyuan15")   # families benched with gradient checkpointing
WARMUP_STEPS = 2                                       # Qwen-Image's shift_terminal grid needs >= 2 steps
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="sd3,flux,wan,qwen_image",
                    help="comma-separated subset of " + ", ".join(FAMILIES) + " (wan22, hunyuan15, ltx2 opt-in)")
    ap.add_argument("--steps", type=int, default=10, help="sampling steps of every rollout")
    ap.add_argument("--scale", choices=("full", "tiny"), default="full", help="tiny: shrunk configs (CPU smoke run)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--no-streaming", action="store_true", help="skip the streaming generator")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="skip the parts not yet started once this many seconds have passed (default 420)")
    ap.add_argument("--quick", action="store_true", help="check that it runs: tiny configs, 2 steps")
    args = ap.parse_args(argv)
    if args.quick:
        args.scale, args.steps = "tiny", 2
    bad = sorted(set(args.families.split(",")) - set(FAMILIES))
    if bad:
        raise SystemExit(f"--families: unknown {bad}; choose from {sorted(FAMILIES)}")
    return args


def load_config(family: str) -> dict:
    """The published transformer config of ``family`` as stored in configs/gpu/."""
    return json.loads((CONFIG_DIR / CONFIGS[family]).read_text())


def shrink(family: str, cfg: dict) -> dict:
    """The same architecture at test size (2 blocks, 2×16 heads, 64-wide text), for ``--scale tiny``."""
    if family in new.CONFIGS:
        return new.shrink(family, cfg)
    if family == "ltx2":
        return ltx2.shrink(cfg)
    small = {**cfg, "num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 16}
    if family == "sd3":
        small.update(caption_projection_dim=32, joint_attention_dim=64, pooled_projection_dim=64,
                     dual_attention_layers=[0], pos_embed_max_size=32)
    elif family == "flux":
        small.update(num_single_layers=2, joint_attention_dim=64, pooled_projection_dim=32, axes_dims_rope=[4, 6, 6])
    elif family == "qwen_image":
        small.update(joint_attention_dim=64, axes_dims_rope=[4, 6, 6])
    elif family == "hunyuan15":
        small.update(num_refiner_layers=1, text_embed_dim=64, text_embed_2_dim=64, image_embed_dim=32,
                     rope_axes_dim=[4, 6, 6])
    else:
        small.update(ffn_dim=64, text_dim=64, rope_max_seq_len=64)
    return small


def build_transformer(cfg: dict, device, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """``diffusers.<_class_name>.from_config(cfg)`` made directly on ``device`` (random init), cast to ``dtype``
    except the class' ``_keep_in_fp32_modules`` (as ``from_pretrained(torch_dtype=...)`` keeps them)."""
    import diffusers

    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(diffusers, cfg["_class_name"]).from_config({k: v for k, v in cfg.items() if k[0] != "_"})
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        want = torch.float32 if keep & set(name.split(".")) else dtype
        t.data = t.data.to(device, want if t.is_floating_point() else t.dtype)
    return model.eval().requires_grad_(False)


def components(family: str, transformer, dtype: torch.dtype, device=None) -> dict:
    """Pipeline components around ``transformer``: tiny random text encoders with the widths it reads, a tiny
    VAE with the real latent factors (×8 space, Wan ×4 time), the family's flow-match scheduler; text encoders and
    VAE on ``device`` (default: the transformer's)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from flowrl.policies.tiny import clip_tokenizer, t5_tokenizer

    if family in new.CONFIGS:
        return new.components(family, transformer, dtype, device)
    if family == "ltx2":
        return ltx2.components(transformer, dtype, device)
    c = transformer.config
    torch.manual_seed(1)
    if family == "sd3":   # CLIP-L + CLIP-G widths split the pooled width 3:5 (768 + 1280 = 2048)
        a = c.pooled_projection_dim * 3 // 8
        text = {"text_encoder": clip_encoder(a, True),
                "text_encoder_2": clip_encoder(c.pooled_projection_dim - a, True),
                "text_encoder_3": t5_encoder(c.joint_attention_dim), "tokenizer": clip_tokenizer(),
                "tokenizer_2": clip_tokenizer(), "tokenizer_3": t5_tokenizer()}
        scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    elif family == "flux":
        text = {"text_encoder": clip_encoder(c.pooled_projection_dim, False),
                "text_encoder_2": t5_encoder(c.joint_attention_dim),
                "tokenizer": clip_tokenizer(), "tokenizer_2": t5_tokenizer()}
        scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                                                    max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
    elif family == "qwen_image":    # Qwen2.5-VL text width = joint_attention_dim; the Qwen-Image scheduler config
        from flowrl.policies.tiny_qwen import qwen_scheduler, qwen_tokenizer, qwen_vl_text_encoder

        tok = qwen_tokenizer()
        text = {"text_encoder": qwen_vl_text_encoder(tok, width=c.joint_attention_dim, layers=1), "tokenizer": tok}
        scheduler = qwen_scheduler()
    elif family == "hunyuan15":      # Qwen2.5-VL text (2 layers: the pipeline reads hidden state −3) + ByT5 widths
        text, scheduler = hunyuan_text(c), FlowMatchEulerDiscreteScheduler(shift=5.0)
    else:                 # Wan 480p: flow_shift 3.0 as the flow-match Euler shift (flowrl.policies.wan)
        text = {"text_encoder": t5_encoder(c.text_dim, umt5=True), "tokenizer": t5_tokenizer()}
        scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
        if family == "wan22":        # the low-noise expert: the same config, its own random weights
            cfg2 = {**dict(c), "_class_name": type(transformer).__name__}
            text["transformer_2"] = build_transformer(cfg2, transformer.device, transformer.dtype, seed=1)
    device = transformer.device if device is None else device
    for k, m in text.items():
        if isinstance(m, torch.nn.Module) and k != "transformer_2":
            text[k] = m.to(device, dtype).eval().requires_grad_(False)
    return {"transformer": transformer, "vae": family_vae(family).to(device).eval(), "scheduler": scheduler, **text}


# ---------------------------------------------------------------------------------------------- timing


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(device, fn) -> tuple:
    """(fn(), {"s": wall seconds, "peak_gib": peak allocated during fn (CUDA), or None})."""
    cuda = torch.device(device).type == "cuda"
    _sync(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    return out, {"s": round(time.perf_counter() - t0, 4), "peak_gib": None if peak is None else round(peak, 2)}


def _autocast(device, dtype):
    return torch.autocast(torch.device(device).type, dtype=dtype) if dtype != torch.float32 else nullcontext()


def _finite_or_none(x: float):
    return round(x, 6) if math.isfinite(x) else None


# ---------------------------------------------------------------------------------------------- one family


def pipeline_call(family, pipe, x, steps, geometry, seq_len, policy=None):
    """The stock pipeline from latents ``x`` (flowrl's unpacked layout) → final latents (unpacked)."""
    if family in new.CONFIGS:
        return new.pipeline_call(family, policy, x, steps, geometry, seq_len, PROMPTS)
    if family == "ltx2":
        return ltx2.pipeline_call(policy, x, steps, geometry, seq_len, PROMPTS)
    h, w, frames, _ = geometry
    kw = {"prompt": PROMPTS[:x.shape[0]], "num_inference_steps": steps, "max_sequence_length": seq_len,
          "output_type": "latent"}
    if family == "sd3":
        return pipe(latents=x.clone(), guidance_scale=4.5, **kw).images
    if family in ("flux", "qwen_image"):
        from flowrl.policies.flux import pack_latents, unpack_latents

        cfg = {"guidance_scale": 3.5} if family == "flux" else {"true_cfg_scale": 4.0,
                                                               "negative_prompt": [" "] * x.shape[0]}
        out = pipe(latents=pack_latents(x), height=h, width=w, **cfg, **kw).images
        return unpack_latents(out, x.shape[-2], x.shape[-1])
    if family == "hunyuan15":        # CFG through the pipeline's guider (6.0, set in components)
        return pipe(prompt=kw["prompt"], latents=x.clone(), num_inference_steps=steps, height=h, width=w,
                    num_frames=frames, output_type="latent").frames
    return pipe(latents=x.clone(), height=h, width=w, num_frames=frames, guidance_scale=5.0, **kw).frames


def flowrl_rollout(policy, x, steps, adapter, autocast):
    from flowrl.eval.sample import ode_sample

    with torch.no_grad(), policy.adapter(adapter), autocast:
        cond = policy.encode(PROMPTS[:x.shape[0]])
        return ode_sample(policy, x, cond, steps, None)


def train_step(policy, objective: str, x1, x0, steps, optimizer, autocast) -> dict:
    """One optimizer step of ``objective`` ("grpo" | "nft") on the "train" LoRA; timed without its rollout."""
    from flowrl.objectives import get_objective
    from flowrl.objectives.sources import Rollout
    from flowrl.types import RolloutResult
    from samplers import KERNELS
    from samplers.rollout import rollout
    from samplers.windows import StepPlan

    spec, b = get_objective(objective), x1.shape[0]
    cfg, w = spec.Config(), policy.default_guidance
    gens = [torch.Generator().manual_seed(10 + i) for i in range(b)]
    with torch.no_grad(), autocast:
        cond = policy.encode(PROMPTS[:b])
        if objective == "grpo":
            kernel = KERNELS.get("flow_sde")
            kcfg = kernel.Config(noise_level=NOISE_LEVEL[policy.family])
            with policy.adapter("old"):
                res = rollout(lambda x, s: policy.velocity(x, s, cond, w), x1, policy.sigmas(steps, x1),
                              StepPlan(steps, (0,)), kernel, kcfg, gens)
        else:
            kernel, kcfg, res = KERNELS.get("ode"), None, RolloutResult(x0, policy.sigmas(steps, x0), None, None, 0)
    adv = torch.randn(b, generator=torch.Generator().manual_seed(3)).to(x1.device)
    batch = spec.TRAINS_ON.batches(Rollout(cond, res, w, kernel, kcfg, "mean"), adv, gens[0], cfg)[0]

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            out = spec.loss(policy, batch, cfg)
        out.loss.backward()
        optimizer.step()
        return float(out.loss.detach())

    step()                                              # warm-up (kernels, AdamW state)
    loss, stats = timed(x1.device, step)
    return {**stats, "loss_finite": math.isfinite(loss)}


def bench_family(family: str, args) -> dict:
    """Every per-family figure (module docstring)."""
    from flowrl.policies import POLICIES

    dtype, device = DTYPES[args.dtype], args.device
    h, w, frames, b = geometry = GEOMETRY[args.scale][family]
    cfg = load_config(family) if args.scale == "full" else shrink(family, load_config(family))
    transformer, built = timed(device, lambda: build_transformer(cfg, device, dtype))
    n_params = sum(p.numel() for p in transformer.parameters())     # before LoRA is added
    cls = POLICIES.get(family)
    short = {"max_sequence_length": 300} if family == "hunyuan15" and args.scale == "tiny" else {}   # CPU smoke
    config = (new.bench_config(cls, family) if family in new.CONFIGS    # Wan video / Qwen 20B activations
              else ltx2.bench_config(cls, args.scale) if family == "ltx2"
              else cls.config_class(gradient_checkpointing=family in CHECKPOINTED, **short))
    flags = {"boundary_ratio": 0.875} if family == "wan22" else {}        # Wan2.2-T2V-A14B's model_index value
    policy = cls(components(family, transformer, dtype), config, device, dtype, **flags)   # adds "train"/"old" LoRA
    pipe, seq_len = policy.pipe, config.max_sequence_length         # the stock pipeline on the same components
    pipe.set_progress_bar_config(disable=True)
    rec = {"params_b": round(n_params / 1e9, 3), "build_s": built["s"], "height": h, "width": w, "frames": frames,
           "batch": b, "steps": args.steps, "lora_rank": config.lora.rank,   # every family runs LoRA here
           "gradient_checkpointing": config.gradient_checkpointing}
    x = policy.noise([torch.Generator().manual_seed(i) for i in range(b)], h, w, frames)
    with torch.no_grad(), policy.adapter(None):                     # LoRA layers bypassed: the stock model
        pipeline_call(family, pipe, x, WARMUP_STEPS, geometry, seq_len, policy)
        ref, rec["pipeline"] = timed(device, lambda: pipeline_call(family, pipe, x, args.steps, geometry, seq_len,
                                                                   policy))
    flowrl_rollout(policy, x, WARMUP_STEPS, None, nullcontext())
    base, rec["flowrl_base"] = timed(device, lambda: flowrl_rollout(policy, x, args.steps, None, nullcontext()))
    rec["rel_diff"] = _finite_or_none(float((base - ref.float()).abs().max() / ref.float().abs().max()))
    lora, rec["flowrl_lora"] = timed(device, lambda: flowrl_rollout(policy, x, args.steps, "old",
                                                                    _autocast(device, dtype)))
    for part in ("pipeline", "flowrl_base", "flowrl_lora"):
        rec[part]["samples_per_s"] = round(b / rec[part]["s"], 4)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-4)
    for objective in ("grpo", "nft"):
        rec[f"{objective}_step"] = train_step(policy, objective, x, lora, args.steps, optimizer,
                                              _autocast(device, dtype))
    return rec


def bench_streaming(args) -> dict:
    """Causal Wan2.1-1.3B: 21 latent frames (81 video frames), chunks of 3, 4 self-forcing steps, KV cache."""
    from flowrl.distill.causal_wan import CausalWan
    from flowrl.distill.rollout import stream_chunks
    from flowrl.distill.schedule import denoising_timesteps

    dtype, device = DTYPES[args.dtype], args.device
    cfg = load_config("wan") if args.scale == "full" else shrink("wan", load_config("wan"))
    frames, (lh, lw) = (21, (60, 104)) if args.scale == "full" else (6, (4, 4))
    model = CausalWan(build_transformer(cfg, device, dtype), chunk_frames=3)
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(1, 16, frames, lh, lw, generator=g).to(device, dtype)
    text = torch.randn(1, 512, model.transformer.config.text_dim, generator=g).to(device, dtype)
    ts = denoising_timesteps("self_forcing")

    def run(z):
        return torch.cat(list(stream_chunks(model, z, text, ts, renoise_kind="ode")), dim=2)

    with torch.no_grad():
        run(noise[:, :, :6])                                        # warm-up
        video, stats = timed(device, lambda: run(noise))
    pixel_frames = 4 * (frames - 1) + 1
    return {**stats, "latent_frames": frames, "video_frames": pixel_frames, "fps": round(pixel_frames / stats["s"], 3),
            "chunks": frames // 3, "latent_hw": [lh, lw], "finite": bool(torch.isfinite(video).all())}


def main(argv: list[str]) -> dict:
    args = parse(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        return {"bench": "gpu", "skipped": "no CUDA device"}
    t0 = time.perf_counter()
    out = {"bench": "gpu", "device": torch.cuda.get_device_name(args.device) if "cuda" in args.device else "cpu",
           "dtype": args.dtype, "scale": args.scale,
           "note": "random transformer weights; tiny random text encoders/VAE (real widths); latents, no decode"}
    parts = [(f, lambda f=f: bench_family(f, args)) for f in args.families.split(",")]
    parts += [] if args.no_streaming else [("streaming", lambda: bench_streaming(args))]
    for name, run in parts:
        if time.perf_counter() - t0 > args.budget_s:
            out[name] = {"skipped": f"time budget of {args.budget_s:.0f} s spent"}
            continue
        t = time.perf_counter()
        out[name] = {**run(), "total_s": round(time.perf_counter() - t, 2)}
        if torch.device(args.device).type == "cuda":
            torch.cuda.empty_cache()                                # the part's model is gone with its frame
    out["total_s"] = round(time.perf_counter() - t0, 2)
    return out
