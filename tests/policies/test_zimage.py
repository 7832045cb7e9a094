"""ZImagePolicy against diffusers' ZImagePipeline on the tiny preset (same components, same latents, float32):
inverted time and negated output, CFG ``pos + s(pos − neg)`` (s = w − 1) with norm clipping and truncation, σ grid,
ODE, decode, save/load, export. ``guidance`` below is the pipeline's s."""
import numpy as np
import pytest
import torch

from flowrl.eval.sample import ode_sample
from flowrl.policies.lora import ZIMAGE_TARGETS, LoraConfig
from flowrl.policies.zimage import Config, ZImagePolicy
from tests.policies.conftest import assert_sde_log_probs_are_normal, generators, pipeline_step_velocities

PROMPTS = ["a red circle left of a blue square", "a photo of a cat"]
H = W = 8
SEQ = 16
LORA = LoraConfig(rank=4, alpha=8, target_modules=ZIMAGE_TARGETS)


@pytest.fixture(scope="module")
def policy():
    return ZImagePolicy.tiny(seed=0, config=Config(max_sequence_length=SEQ, lora=LORA))


def _kw(policy, guidance, **kw):
    c = policy.config
    return {"prompt": list(PROMPTS), "height": H, "width": W, "max_sequence_length": SEQ, "guidance_scale": guidance,
            "cfg_normalization": c.cfg_normalization, "cfg_truncation": c.cfg_truncation, **kw}


def _match_pipeline(policy, pipe, guidance, adapter=None, steps=3):
    x = policy.noise(generators(2), H, W)
    sig, xs, vs = pipeline_step_velocities(pipe, x, steps, **_kw(policy, guidance))
    assert torch.equal(policy.sigmas(steps, x), sig)
    cond = policy.encode(PROMPTS, cfg=guidance > 0)
    with torch.no_grad(), policy.adapter(adapter):        # flowrl's w is the pipeline's s + 1
        vel = [policy.velocity(xs[i], sig[i], cond, guidance + 1) for i in range(steps)]
    for i in range(steps):
        torch.testing.assert_close(vel[i], vs[i], atol=1e-5, rtol=0)
    return vel


@pytest.mark.parametrize("guidance,norm,trunc", [(0.0, 0.0, 1.0), (0.5, 0.0, 1.0), (4.0, 0.0, 1.0),
                                                   (4.0, 1.02, 0.3)])
def test_velocity_matches_pipeline(policy, guidance, norm, trunc):
    policy.config.cfg_normalization, policy.config.cfg_truncation = norm, trunc
    try:
        vel = _match_pipeline(policy, policy.pipe, guidance)
        if norm:          # the clip and the truncation both act on this grid (1 − σ passes 0.3 at the last step)
            policy.config.cfg_normalization, policy.config.cfg_truncation = 0.0, 1.0
            plain = _match_pipeline(policy, policy.pipe, guidance)
            assert (vel[0] - plain[0]).abs().max() > 1e-4 and (vel[2] - plain[2]).abs().max() > 1e-4
    finally:
        policy.config.cfg_normalization, policy.config.cfg_truncation = 0.0, 1.0


def test_prompt_rows_keep_the_pipelines_variable_lengths(policy):
    rows, _ = policy.pipe.encode_prompt(prompt=["a cat", "a red circle left of a blue square"],
                                        do_classifier_free_guidance=False, max_sequence_length=SEQ)
    cond = policy.encode(["a cat", "a red circle left of a blue square"], cfg=False)
    assert cond.embeds["prompt_embeds"].shape[1] == SEQ and rows[0].shape[0] < rows[1].shape[0]
    for b in range(2):
        assert torch.equal(policy._rows(cond.embeds)[b], rows[b])
    with pytest.raises(ValueError, match="cfg=True"):
        policy.velocity(policy.noise(generators(2), H, W), 0.5, cond, 5.0)


def test_ode_rollout_and_decode_match_pipeline(policy):
    x = policy.noise(generators(2), H, W)
    policy.pipe.set_progress_bar_config(disable=True)
    with torch.no_grad(), policy.adapter(None):
        x0 = ode_sample(policy, x, policy.encode(PROMPTS), 3, 5.0)
        out = policy.pipe(latents=x.clone(), num_inference_steps=3, output_type="latent", **_kw(policy, 4.0)).images
        img = policy.pipe(latents=x.clone(), num_inference_steps=3, output_type="pt", **_kw(policy, 4.0)).images
    torch.testing.assert_close(out, x0, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(x0), img.float(), atol=1e-5, rtol=0)


def test_sde_log_probs_are_normal_on_zimage_latents(policy):
    assert_sde_log_probs_are_normal(policy, policy.noise(generators(2), H, W), policy.encode(PROMPTS), 0.8, 0.6, 5.0)


@pytest.mark.parametrize("dynamic", [False, True])
def test_sigmas_equal_the_pipeline_recipe(policy, dynamic):
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift

    config = {**policy.scheduler_config, "use_dynamic_shifting": dynamic}
    sched = FlowMatchEulerDiscreteScheduler.from_config(config)
    latents = torch.zeros(1, 4, 128, 96)
    sched.set_timesteps(sigmas=np.linspace(1.0, 1 / 10, 10), mu=calculate_shift(64 * 48))
    saved, policy.scheduler_config = policy.scheduler_config, config
    try:
        assert torch.equal(policy.sigmas(10, latents), sched.sigmas)
    finally:
        policy.scheduler_config = saved


def test_shard_units_are_every_block_and_full_finetune_is_the_default():
    assert Config().lora is None and Config().guidance == 5.0        # w = the anchor's guidance_scale 4 + 1
    policy = ZImagePolicy.tiny(seed=0, config=Config(max_sequence_length=SEQ))
    assert len(policy.trainable_parameters()) == len(list(policy.transformer.parameters()))
    (module, blocks), *frozen = policy.shard_units()
    assert module is policy.transformer and len(frozen) == 2        # "old" and the base copies
    assert {type(b).__name__ for b in blocks} == {"ZImageTransformerBlock"} and len(blocks) == 4


def test_save_load_round_trip_and_exports_in_the_stock_pipeline(policy, tmp_path):
    import diffusers

    from flowrl.policies.export import save_diffusers_lora, save_merged

    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in policy.adapter_parameters("train"):
            p.copy_(0.05 * torch.randn(p.shape, generator=g))
    base = policy.save_pretrained(tmp_path / "base")
    again = ZImagePolicy.from_pretrained(str(base), dtype=torch.float32)
    assert again.config == policy.config
    x, cond = policy.noise(generators(2), H, W), policy.encode(PROMPTS)
    with torch.no_grad():
        for name in ("train", "old", None):
            with policy.adapter(name), again.adapter(name):
                assert torch.equal(policy.velocity(x, 0.4, cond), again.velocity(x, 0.4, again.encode(PROMPTS)))
    lora_file = save_diffusers_lora(policy, tmp_path / "lora")
    with_lora = diffusers.ZImagePipeline.from_pretrained(base)
    with_lora.load_lora_weights(lora_file.parent)
    merged = diffusers.ZImageTransformer2DModel.from_pretrained(save_merged(policy, tmp_path / "merged"))
    for pipe in (with_lora, diffusers.ZImagePipeline.from_pretrained(base, transformer=merged)):
        vel = _match_pipeline(policy, pipe, 4.0, adapter="train", steps=2)
    with torch.no_grad(), policy.adapter(None):
        assert (policy.velocity(x, 0.5, cond, 5.0) - vel[0]).abs().max() > 1e-4
        for p in policy.adapter_parameters("train"):
            p.zero_()
