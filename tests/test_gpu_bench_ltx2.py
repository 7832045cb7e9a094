"""``scripts/bench.py gpu --families ltx2`` (flowrl/bench/gpu_ltx2.py) on CPU: configs/gpu/ltx2_transformer.json against
the conversion script's LTX-2.0 config, the full-size setup builds on the meta device (19B transformer, the bench's
text side and decoders at the widths and factors it reads, the LoRA targets) and the whole bench runs at tiny scale
with flowrl's rollout equal to the stock pipeline's."""
import inspect
import json

import pytest
import torch

# The "2.0" diffusers_config of huggingface/diffusers scripts/convert_ltx2_to_diffusers.py::get_ltx2_transformer_config
# (commit 8d8a656; the script converts Lightricks/LTX-2's ltx-2-19b-dev.safetensors into the diffusers layout). The hub
# repo's transformer/config.json itself is not reachable offline.
CONVERSION_2_0 = {
    "in_channels": 128, "out_channels": 128, "patch_size": 1, "patch_size_t": 1, "num_attention_heads": 32,
    "attention_head_dim": 128, "cross_attention_dim": 4096, "vae_scale_factors": [8, 32, 32], "pos_embed_max_pos": 20,
    "base_height": 2048, "base_width": 2048, "audio_in_channels": 128, "audio_out_channels": 128,
    "audio_patch_size": 1, "audio_patch_size_t": 1, "audio_num_attention_heads": 32, "audio_attention_head_dim": 64,
    "audio_cross_attention_dim": 2048, "audio_scale_factor": 4, "audio_pos_embed_max_pos": 20,
    "audio_sampling_rate": 16000, "audio_hop_length": 160, "num_layers": 48, "activation_fn": "gelu-approximate",
    "qk_norm": "rms_norm_across_heads", "norm_elementwise_affine": False, "norm_eps": 1e-6, "caption_channels": 3840,
    "attention_bias": True, "attention_out_bias": True, "rope_theta": 10000.0, "rope_double_precision": True,
    "causal_offset": 1, "timestep_scale_multiplier": 1000, "cross_attn_timestep_scale_multiplier": 1000,
    "rope_type": "split"}


def test_config_is_the_conversion_scripts_and_class_defaults_elsewhere():
    """Every key the LTX-2.0 conversion sets equals the repo's file; every other key (the LTX-2.3 switches: gated
    attention, prompt modulation, perturbed attention, keyframe embedding, …) is the class default, i.e. off."""
    from diffusers import LTX2VideoTransformer3DModel

    cfg = _bench().load_config("ltx2")
    assert {k: cfg[k] for k in CONVERSION_2_0} == CONVERSION_2_0
    defaults = {k: p.default for k, p in inspect.signature(LTX2VideoTransformer3DModel.__init__).parameters.items()
                if k != "self"}
    rest = {k: v for k, v in cfg.items() if k not in CONVERSION_2_0 and k[0] != "_"}
    assert rest and rest == {k: defaults[k] for k in rest}
    assert set(cfg) - {"_class_name"} == set(defaults)                   # no key missing, none unknown


def _bench():
    from flowrl.bench.benchmarks import gpu

    return gpu


def test_ltx2_is_opt_in_and_named():
    bench = _bench()
    assert "ltx2" in bench.FAMILIES and "ltx2" not in bench.parse([]).families.split(",")
    assert bench.parse(["--families", "ltx2"]).families == "ltx2"


def test_full_size_setup_builds_on_meta():
    """The bench's components around the published transformer: the pipeline reads ×32 / ×8 video factors and
    16 mel latents × 8 channels (= the 128 audio inputs), the connectors emit caption_channels-wide embeddings, and
    every LoRA target of the policy is a Linear in each of the 48 blocks."""
    from diffusers import LTX2Pipeline

    from flowrl.bench import gpu_ltx2
    from flowrl.policies.ltx2 import LTX2_TARGETS, LTX2Policy

    bench = _bench()
    cfg = bench.load_config("ltx2")
    transformer = bench.build_transformer(cfg, "meta", torch.bfloat16)
    assert sum(p.numel() for p in transformer.parameters()) == 18_876_174_592
    with torch.device("meta"):
        comps = gpu_ltx2.components(transformer, torch.bfloat16, "meta")
    pipe = LTX2Pipeline(**comps)
    assert (pipe.vae_spatial_compression_ratio, pipe.vae_temporal_compression_ratio) == (32, 8)
    assert pipe.vae.config.latent_channels == cfg["in_channels"]
    mel = pipe.audio_vae.config.mel_bins // pipe.audio_vae_mel_compression_ratio
    assert pipe.audio_vae.config.latent_channels * mel == cfg["audio_in_channels"]
    conn = comps["connectors"].config
    assert conn.caption_channels == cfg["caption_channels"] == comps["text_encoder"].config.text_config.hidden_size
    assert conn.video_connector_num_attention_heads * conn.video_connector_attention_head_dim == cfg["caption_channels"]
    assert conn.text_proj_in_factor == comps["text_encoder"].config.text_config.num_hidden_layers + 1
    config = gpu_ltx2.bench_config(LTX2Policy, "full")
    assert config.gradient_checkpointing and config.stg_blocks == (28,) and config.lora.rank == 64
    assert config.lora.target_modules == LTX2_TARGETS and len(transformer.transformer_blocks) == 48
    for block in transformer.transformer_blocks:
        modules = dict(block.named_modules())
        assert all(isinstance(modules[t], torch.nn.Linear) for t in LTX2_TARGETS)


@pytest.mark.slow
def test_tiny_scale_runs_every_part_of_ltx2_on_cpu():
    out = _bench().main(["--scale", "tiny", "--device", "cpu", "--dtype", "float32", "--steps", "2",
                         "--families", "ltx2", "--no-streaming"])
    rec = out["ltx2"]
    assert rec["rel_diff"] is not None and rec["rel_diff"] <= 1e-5
    assert rec["grpo_step"]["loss_finite"] and rec["nft_step"]["loss_finite"]
    json.dumps(out, allow_nan=False)
