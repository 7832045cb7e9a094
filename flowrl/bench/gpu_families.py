"""The 2026 families of ``scripts/bench.py gpu``: FLUX.2 [dev] (32B), FLUX.2 [klein] 4B and Z-Image (6B).

The same parts as the older families (``flowrl/bench/benchmarks/gpu.py``): each transformer from its published
``config.json`` (``configs/gpu/``; sources in ``tests/test_gpu_bench_2026.py``) with random weights, around tiny
random text encoders that have the widths the transformer reads (Mistral3 / Qwen3 hidden = joint_attention_dim / 3
for FLUX.2, = cap_feat_dim for Z-Image; 30 layers so FLUX.2's hidden-state indices exist), a tiny VAE with the real
factor 8 and latent channels (FLUX.2's with BatchNorm statistics), and the family's scheduler. Not in the default
``--families`` (FLUX.2 [dev] alone is 64 GB of bf16 weights): name them, e.g. ``--families flux2_klein,zimage``.
"""
from __future__ import annotations

import torch

CONFIGS = {"flux2": "flux2_dev_transformer.json", "flux2_klein": "flux2_klein_4b_transformer.json",
           "zimage": "zimage_transformer.json"}
GEOMETRY = {"full": {"flux2": (512, 512, None, 1), "flux2_klein": (512, 512, None, 2), "zimage": (512, 512, None, 2)},
            "tiny": {"flux2": (32, 32, None, 2), "flux2_klein": (32, 32, None, 2), "zimage": (32, 32, None, 2)}}
NOISE_LEVEL = {"flux2": 0.7, "flux2_klein": 0.7, "zimage": 0.7}    # the recipes' flow_sde a (Flow-Factory 0.7)
GUIDANCE = {"flux2": 4.0, "flux2_klein": 4.0, "zimage": 4.0}     # the pipelines' guidance_scale (Z-Image: w − 1)


def shrink(family: str, cfg: dict) -> dict:
    """The same architecture at test size (2 blocks of 2×16 heads; 16-wide text)."""
    if family == "zimage":
        return {**cfg, "dim": 32, "n_heads": 2, "n_kv_heads": 2, "n_layers": 2, "n_refiner_layers": 1,
                "cap_feat_dim": 16, "axes_dims": [8, 4, 4], "axes_lens": [64, 32, 32]}
    return {**cfg, "num_layers": 2, "num_single_layers": 2, "num_attention_heads": 2, "attention_head_dim": 16,
            "joint_attention_dim": 48, "timestep_guidance_channels": 32, "axes_dims_rope": [4, 4, 4, 4]}


def bench_config(cls, family: str):
    """The policy Config the bench runs: the family default, LoRA for Z-Image too (its recipe trains in full)."""
    if family != "zimage":
        return cls.config_class()
    from flowrl.policies.lora import ZIMAGE_TARGETS, LoraConfig

    return cls.config_class(lora=LoraConfig(rank=32, alpha=64, target_modules=ZIMAGE_TARGETS))


def components(family: str, transformer, dtype: torch.dtype, device=None) -> dict:
    """Pipeline components around ``transformer`` (module doc); text encoder and VAE on ``device``."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler

    from flowrl.policies import tiny_chat as tc

    c = transformer.config
    torch.manual_seed(1)
    if family == "zimage":
        text = {"text_encoder": tc.qwen3_encoder(2, causal_lm=False, width=c.cap_feat_dim),
                "tokenizer": tc.qwen_tokenizer()}
        vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                            up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8,) * 4, layers_per_block=1,
                            latent_channels=c.in_channels, norm_num_groups=8, use_quant_conv=False,
                            use_post_quant_conv=False, scaling_factor=0.3611, shift_factor=0.1159)
        scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    else:
        width = c.joint_attention_dim // 3
        text = ({"text_encoder": tc.mistral3_encoder(width), "tokenizer": tc.mistral_processor()}
                if family == "flux2" else {"text_encoder": tc.qwen3_encoder(30, width=width),
                                           "tokenizer": tc.qwen_tokenizer()})
        vae = tc.flux2_vae(0, blocks=4, latent_channels=c.in_channels // 4)
        scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True)   # FLUX.1-dev's config
    device = transformer.device if device is None else device
    text["text_encoder"] = text["text_encoder"].to(device, dtype).eval().requires_grad_(False)
    return {"transformer": transformer, "vae": vae.to(device).eval(), "scheduler": scheduler, **text}


def pipeline_call(family, policy, x, steps, geometry, seq_len, prompts):
    """The stock pipeline from flowrl's latents ``x`` → its final latents in flowrl's layout."""
    from flowrl.policies.flux2 import unpack

    h, w, _, _ = geometry
    kw = {"prompt": list(prompts[:x.shape[0]]), "num_inference_steps": steps, "max_sequence_length": seq_len,
          "output_type": "latent", "height": h, "width": w, "guidance_scale": GUIDANCE[family]}
    out = policy.pipe(latents=x.clone(), **kw).images
    if family == "flux2":                      # packed tokens
        return unpack(out, x.shape[-2], x.shape[-1])
    if family == "flux2_klein":                # VAE latents: patchify and BN-normalise back
        bn, eps = policy.vae.bn, policy.vae.config.batch_norm_eps
        z = policy.pipe._patchify_latents(out)
        return (z - bn.running_mean.view(1, -1, 1, 1)) / torch.sqrt(bn.running_var.view(1, -1, 1, 1) + eps)
    return out
