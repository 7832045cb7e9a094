"""Export: the diffusers-lora file and the merged transformer, loaded by stock diffusers pipelines, reproduce the
flowrl policy's trained-adapter samples (tiny SD3 / FLUX / Wan / Qwen-Image, float32, offline)."""
import json

import pytest
import torch

from flowrl.eval.sample import ode_sample
from flowrl.policies import lora
from flowrl.policies.export import export, merged_transformer, save_diffusers_lora, save_merged
from tests.policies.conftest import generators, pipeline_step_velocities

PROMPTS = ["a red circle left of a blue square", "a photo of a cat"]
STEPS = 3
# family: (pipeline class, transformer class, height, width, num_frames, guidance)
FAMILIES = {
    "sd3": ("StableDiffusion3Pipeline", "SD3Transformer2DModel", 16, 16, None, 4.5),
    "flux": ("FluxPipeline", "FluxTransformer2DModel", 8, 8, None, 3.5),
    "wan": ("WanPipeline", "WanTransformer3DModel", 16, 16, 5, 5.0),
    "qwen_image": ("QwenImagePipeline", "QwenImageTransformer2DModel", 16, 16, None, 4.0),
}


def _diffusers(name):
    import diffusers

    return getattr(diffusers, name)


def _tiny_policy(family, seed=0, **config):
    from flowrl.policies import POLICIES

    cls = POLICIES.get(family)
    return cls.tiny(seed=seed, config=cls.config_class(max_sequence_length=16, **config))


@torch.no_grad()
def _perturb(policy, name, scale, seed):
    g = torch.Generator().manual_seed(seed)
    for p in policy.adapter_parameters(name):
        p.add_(scale * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def exported(request, tmp_path_factory):
    """(family, policy with distinct non-zero "train"/"old" adapters, base pipeline dir, lora dir, merged dir)."""
    family = request.param
    policy = _tiny_policy(family)
    _perturb(policy, "train", 0.05, 1)
    _perturb(policy, "old", 0.03, 2)
    root = tmp_path_factory.mktemp(f"export_{family}")
    base = policy.save_pretrained(root / "base")
    lora_file = save_diffusers_lora(policy, root / "lora")
    merged = save_merged(policy, root / "merged")
    return family, policy, base, lora_file, merged


def _pipeline_call(family, pipe, x, output_type):
    """Run the stock pipeline from latents ``x`` (flowrl's unpacked layout); return its output tensor."""
    _, _, h, w, frames, guidance = FAMILIES[family]
    pipe.set_progress_bar_config(disable=True)
    kw = {"prompt": PROMPTS, "num_inference_steps": STEPS, "guidance_scale": guidance, "max_sequence_length": 16,
          "output_type": output_type}
    if family == "sd3":
        return pipe(latents=x.clone(), **kw).images
    if family == "qwen_image":              # true CFG against the policy's default negative " "
        kw.update(guidance_scale=None, true_cfg_scale=guidance, negative_prompt=[" "] * len(PROMPTS))
    if family in ("flux", "qwen_image"):
        from flowrl.policies.flux import pack_latents, unpack_latents

        out = pipe(latents=pack_latents(x), height=h, width=w, **kw).images
        return unpack_latents(out, x.shape[-2], x.shape[-1]) if output_type == "latent" else out
    return pipe(latents=x.clone(), height=h, width=w, num_frames=frames, **kw).frames


@torch.no_grad()
def _policy_sample(family, policy, adapter="train"):
    _, _, h, w, frames, guidance = FAMILIES[family]
    x = policy.noise(generators(2), h, w, frames)
    with policy.adapter(adapter):
        x0 = ode_sample(policy, x, policy.encode(PROMPTS), STEPS, guidance)
    return x, x0, policy.decode(x0)


def _assert_pipeline_matches_policy(family, policy, pipe):
    x, x0, pixels = _policy_sample(family, policy)
    with torch.no_grad():
        torch.testing.assert_close(_pipeline_call(family, pipe, x, "latent").float(), x0, atol=1e-5, rtol=0)
        torch.testing.assert_close(_pipeline_call(family, pipe, x, "pt").float(), pixels, atol=1e-5, rtol=0)


def test_diffusers_lora_loaded_by_the_stock_pipeline_matches_the_policy(exported):
    family, policy, base, lora_file, _ = exported
    assert lora_file.name == "pytorch_lora_weights.safetensors"
    pipe = _diffusers(FAMILIES[family][0]).from_pretrained(base)
    pipe.load_lora_weights(lora_file.parent)
    _assert_pipeline_matches_policy(family, policy, pipe)
    with torch.no_grad(), policy.adapter(None):       # the adapter matters: the base samples differ
        x = policy.noise(generators(2), *FAMILIES[family][2:5])
        base_x0 = ode_sample(policy, x, policy.encode(PROMPTS), STEPS, FAMILIES[family][5])
    assert (base_x0 - _pipeline_call(family, pipe, x, "latent")).abs().max() > 1e-4


def test_diffusers_lora_file_carries_peft_rank_and_alpha(exported):
    from safetensors import safe_open

    _, policy, _, lora_file, _ = exported
    with safe_open(str(lora_file), "pt") as f:
        meta = json.loads(f.metadata()["lora_adapter_metadata"])
        keys = set(f.keys())
    assert (meta["transformer.r"], meta["transformer.lora_alpha"]) == (policy.config.lora.rank,
                                                                         policy.config.lora.alpha)
    assert len(keys) == len(policy.adapter_parameters("train"))
    assert all(k.startswith("transformer.") and ".lora_" in k for k in keys)


def test_merged_transformer_loaded_by_the_stock_pipeline_matches_the_policy(exported):
    family, policy, base, _, merged = exported
    pipeline_cls, transformer_cls = (_diffusers(n) for n in FAMILIES[family][:2])
    transformer = transformer_cls.from_pretrained(merged)
    assert not lora.tuner_layers(transformer) and not any(".lora_" in k for k in transformer.state_dict())
    pipe = pipeline_cls.from_pretrained(base, transformer=transformer)
    _assert_pipeline_matches_policy(family, policy, pipe)


def test_merge_leaves_the_policy_untouched_and_fuses_the_old_adapter_too(exported):
    family, policy, _, _, _ = exported
    before = {n: policy.adapter_state_dict(n) for n in ("train", "old")}
    x, x0_train, _ = _policy_sample(family, policy)
    old = merged_transformer(policy, "old")
    assert not any(p.requires_grad for p in old.parameters())
    assert len(lora.tuner_layers(policy.transformer)) > 0 and lora.active_adapter(policy.transformer) == "train"
    for n in ("train", "old"):
        assert all(torch.equal(v, policy.adapter_state_dict(n)[k]) for k, v in before[n].items())
    assert torch.equal(_policy_sample(family, policy)[1], x0_train)
    _, x0_old, _ = _policy_sample(family, policy, "old")
    policy.weights.forward_module = old             # run the policy's own velocity through the merged copy
    try:
        with torch.no_grad(), policy.adapter(None):
            x0_merged = ode_sample(policy, x, policy.encode(PROMPTS), STEPS, FAMILIES[family][5])
    finally:
        policy.weights.forward_module = policy.transformer
    torch.testing.assert_close(x0_merged, x0_old, atol=1e-5, rtol=0)


def test_full_fine_tune_exports_merged_only(tmp_path):
    policy = _tiny_policy("sd3", seed=1, lora=None)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.01 * torch.randn_like(p))
    with pytest.raises(ValueError, match="--format merged"):
        save_diffusers_lora(policy, tmp_path / "lora")
    out = export(policy, tmp_path / "merged", "merged")
    loaded = _diffusers("SD3Transformer2DModel").from_pretrained(out)
    for k, v in policy.transformer.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    old = merged_transformer(policy, "old").state_dict()
    assert all(torch.equal(old[k], v) for k, v in policy.adapter_state_dict("old").items())
    assert not all(torch.equal(old[k], v) for k, v in policy.adapter_state_dict("train").items())


def test_bad_format_and_adapter_names(exported, tmp_path):
    _, policy, _, _, _ = exported
    with pytest.raises(ValueError, match="diffusers-lora"):
        export(policy, tmp_path, "ckpt")
    with pytest.raises(ValueError, match="adapter 'ema'"):
        merged_transformer(policy, "ema")


# ---------------------------------------------------------------------------------------------- the script

def _script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "export.py"
    spec = importlib.util.spec_from_file_location("flowrl_export_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_export_script_on_a_tiny_run_directory(tmp_path):
    """config.yaml (tiny sd3, seed 5) + a trainer checkpoint → both formats reproduce the checkpoint's velocity."""
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

    from flowrl.checkpoint import save_checkpoint
    from flowrl.config import load_config, save_resolved
    from flowrl.training.parts import build_policy

    run = tmp_path / "run"
    cfg = load_config(None, ["policy.kind=sd3", "policy.tiny=true", "policy.max_sequence_length=8", "run.seed=5",
                             "policy.lora={rank: 2, alpha: 4, target_modules: [to_q, to_v]}"])
    save_resolved(cfg, run)
    policy = build_policy(cfg, "cpu")
    _perturb(policy, "train", 0.1, 3)
    tensors = {n: policy.adapter_state_dict(n) for n in ("train", "old")}
    save_checkpoint(run, 7, tensors, {"loop": {"iteration": 7}})
    save_checkpoint(run, 9, {n: {k: torch.zeros_like(v) for k, v in t.items()} for n, t in tensors.items()}, {})

    script = _script()
    lora_info = script.main([str(run), "--step", "7", "--format", "diffusers-lora", "--out", str(tmp_path / "l")])
    merged_info = script.main([str(run), "--step", "7", "--format", "merged", "--out", str(tmp_path / "m")])
    assert lora_info["step"] == merged_info["step"] == 7 and lora_info["weights"] == "train"

    latest = script.main([str(run), "--format", "diffusers-lora", "--out", str(tmp_path / "latest")])
    assert latest["step"] == 9

    base = build_policy(cfg, "cpu").save_pretrained(tmp_path / "base")    # same seed: the run's base weights
    merged = SD3Transformer2DModel.from_pretrained(tmp_path / "m")
    pipes = {"diffusers-lora": StableDiffusion3Pipeline.from_pretrained(base),
             "merged": StableDiffusion3Pipeline.from_pretrained(base, transformer=merged)}
    pipes["diffusers-lora"].load_lora_weights(tmp_path / "l")
    x = policy.noise(generators(2), 16, 16)
    cond = policy.encode(PROMPTS, cfg=False)
    for pipe in pipes.values():
        sig, xs, vs = pipeline_step_velocities(pipe, x, 2, prompt=PROMPTS, guidance_scale=1.0,
                                               max_sequence_length=8)
        with torch.no_grad(), policy.adapter("train"):
            for i in range(2):
                torch.testing.assert_close(policy.velocity(xs[i], sig[i], cond, 1.0), vs[i].float(),
                                           atol=1e-5, rtol=0)


def test_export_script_errors(tmp_path):
    script = _script()
    with pytest.raises(SystemExit):
        script.main([str(tmp_path), "--format", "zip", "--out", str(tmp_path / "o")])
    from flowrl.checkpoint import CheckpointError

    with pytest.raises((CheckpointError, FileNotFoundError), match="config.yaml|checkpoint"):
        script.main([str(tmp_path), "--format", "merged", "--out", str(tmp_path / "o")])
