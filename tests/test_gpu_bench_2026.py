"""GPU readiness of the 2026 families (flowrl/bench/gpu_families.py): the repo's transformer configs equal the
published ones, build their diffusers class on the meta device with the published parameter count, and hold the
modules flowrl's LoRA targets and FSDP units name; the bench's tiny text encoders fit the full transformer."""
import json
from fnmatch import fnmatchcase

import pytest
import torch

# The published transformer/config.json values (architecture keys; "_diffusers_version" / "_name_or_path" left out).
# The hub repos are not reachable offline; sources:
PUBLISHED = {
    # black-forest-labs/FLUX.2-dev: the "diffusers_config" of "flux2-dev" in huggingface/diffusers
    # scripts/convert_flux2_to_diffusers.py::get_flux2_transformer_config (the script that wrote the diffusers
    # repo); no guidance_embeds key (class default True: the distilled guidance embedding).
    "flux2": {"_class_name": "Flux2Transformer2DModel", "attention_head_dim": 128, "axes_dims_rope": [32, 32, 32, 32],
              "eps": 1e-06, "in_channels": 128, "joint_attention_dim": 15360, "mlp_ratio": 3.0,
              "num_attention_heads": 48, "num_layers": 8, "num_single_layers": 48, "patch_size": 1,
              "rope_theta": 2000, "timestep_guidance_channels": 256},
    # black-forest-labs/FLUX.2-klein-base-4B transformer/config.json as reproduced verbatim in a public FLUX.2 port
    # ("byte-identical to the distilled FLUX.2-Klein-4B one"), equal to the "klein-4b" diffusers_config of
    # convert_flux2_to_diffusers.py (which omits out_channels: null).
    "flux2_klein": {"_class_name": "Flux2Transformer2DModel", "attention_head_dim": 128,
                    "axes_dims_rope": [32, 32, 32, 32], "eps": 1e-06, "guidance_embeds": False, "in_channels": 128,
                    "joint_attention_dim": 7680, "mlp_ratio": 3.0, "num_attention_heads": 24, "num_layers": 5,
                    "num_single_layers": 20, "out_channels": None, "patch_size": 1, "rope_theta": 2000,
                    "timestep_guidance_channels": 256},
    # Tongyi-MAI/Z-Image-Turbo transformer/config.json ("_diffusers_version": "0.36.0.dev0"), as copied verbatim by
    # several public Z-Image loaders (DEFAULT_ZIMAGE_TRANSFORMER_CONFIG); Z-Image base shares the architecture.
    "zimage": {"_class_name": "ZImageTransformer2DModel", "all_f_patch_size": [1], "all_patch_size": [2],
               "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512], "cap_feat_dim": 2560, "dim": 3840,
               "in_channels": 16, "n_heads": 30, "n_kv_heads": 30, "n_layers": 30, "n_refiner_layers": 2,
               "norm_eps": 1e-05, "qk_norm": True, "rope_theta": 256.0, "t_scale": 1000.0},
}
# Published sizes (model cards: FLUX.2 [dev] "32 billion parameter", FLUX.2 [klein] "4B", Z-Image "6B"); the
# meta-device counts are 32.22e9, 3.88e9 and 6.15e9.
SIZES = {"flux2": (31.5e9, 32.5e9), "flux2_klein": (3.5e9, 4.5e9), "zimage": (5.5e9, 6.5e9)}


def _bench():
    from flowrl.bench.benchmarks import gpu

    return gpu


@pytest.fixture(scope="module")
def meta_models():
    import diffusers

    out = {}
    for family, cfg in PUBLISHED.items():
        with torch.device("meta"):
            out[family] = getattr(diffusers, cfg["_class_name"]).from_config(
                {k: v for k, v in cfg.items() if k[0] != "_"})
    return out


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_repo_configs_equal_the_published_ones(family):
    assert _bench().load_config(family) == PUBLISHED[family]


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_published_config_has_the_published_size(family, meta_models):
    model = meta_models[family]
    assert all(t.is_meta for t in model.state_dict().values())
    for key, value in PUBLISHED[family].items():
        if key[0] != "_":
            assert model.config[key] == (tuple(value) if isinstance(value, list) and
                                         isinstance(model.config[key], tuple) else value), key
    lo, hi = SIZES[family]
    assert lo < sum(t.numel() for t in model.state_dict().values()) < hi


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_lora_targets_and_shard_units_exist_in_the_full_model(family, meta_models):
    from flowrl.policies import POLICIES
    from flowrl.policies.lora import ZIMAGE_TARGETS

    cls, model = POLICIES.get(family), meta_models[family]
    assert cls.spec["transformer"] == ("diffusers", PUBLISHED[family]["_class_name"])
    targets = cls.config_class().lora.target_modules if family != "zimage" else ZIMAGE_TARGETS
    modules = dict(model.named_modules())
    for t in targets:
        hits = [n for n in modules if (fnmatchcase(n, t) if "*" in t else n == t or n.endswith("." + t))]
        assert hits and all(isinstance(modules[n], torch.nn.Linear) for n in hits), t
    blocks = [b for attr in cls.shard_blocks for b in getattr(model, attr)]
    assert {type(b).__name__ for b in blocks} == set(model._no_split_modules)
    want = {"flux2": 8 + 48, "flux2_klein": 5 + 20, "zimage": 2 + 2 + 30}[family]
    assert len(blocks) == want


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_bench_text_encoders_fit_the_full_transformer(family, meta_models):
    """The stock pipeline encodes with the bench's tiny text encoders at the width the full transformer reads; for
    FLUX.2, one meta-device forward of the full transformer on flowrl's packed tokens and position ids."""
    import diffusers

    from flowrl.policies import POLICIES
    from flowrl.policies.flux2 import latent_ids, pack, text_ids

    bench, cls, transformer = _bench(), POLICIES.get(family), meta_models[family]
    pipe = getattr(diffusers, cls.pipeline_class)(**bench.components(family, transformer, torch.float32, "cpu"))
    h, w, _, b = bench.GEOMETRY["full"][family]
    if family == "zimage":
        rows, _ = pipe.encode_prompt(prompt=bench.PROMPTS[:b], device="cpu", do_classifier_free_guidance=False,
                                     max_sequence_length=16)
        assert {r.shape[-1] for r in rows} == {PUBLISHED[family]["cap_feat_dim"]}
        assert pipe.vae_scale_factor == 8 and pipe.vae.config.latent_channels == transformer.config.in_channels
        return
    layers = cls.config_class().text_encoder_out_layers
    pe, _ = pipe.encode_prompt(prompt=bench.PROMPTS[:b], device="cpu", max_sequence_length=16,
                               text_encoder_out_layers=layers)
    assert pe.shape[-1] == PUBLISHED[family]["joint_attention_dim"]
    x = torch.empty(b, 128, h // 16, w // 16, device="meta")
    guidance = torch.full((b,), 4.0, device="meta") if family == "flux2" else None
    v = transformer(hidden_states=pack(x), timestep=torch.full((b,), 0.5, device="meta"), guidance=guidance,
                    encoder_hidden_states=pe.to("meta"), txt_ids=text_ids(16, "meta"),
                    img_ids=latent_ids(h // 16, w // 16, device="meta"), return_dict=False)[0]
    assert v.shape == pack(x).shape


@pytest.mark.slow
def test_tiny_scale_runs_every_part_of_the_new_families_on_cpu():
    out = _bench().main(["--scale", "tiny", "--device", "cpu", "--dtype", "float32", "--steps", "2",
                         "--families", "flux2,flux2_klein,zimage", "--no-streaming"])
    for family in PUBLISHED:
        rec = out[family]
        assert rec["rel_diff"] is not None and rec["rel_diff"] <= 1e-5, family
        assert rec["grpo_step"]["loss_finite"] and rec["nft_step"]["loss_finite"]
    json.dumps(out, allow_nan=False)
