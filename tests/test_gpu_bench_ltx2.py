"""``scripts/bench.py gpu --families ltx2`` (flowrl/bench/gpu_ltx2.py) on CPU: the full-size setup builds on the meta
device (19B transformer, the bench's text side and decoders at the widths and factors it reads, the policy with its
LoRA) and the whole bench runs at tiny scale with flowrl's rollout equal to the stock pipeline's."""
import json

import pytest
import torch


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
