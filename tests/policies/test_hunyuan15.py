"""HunyuanVideo15Policy against diffusers' HunyuanVideo15Pipeline on the tiny preset (same components, latents)."""
import pytest
import torch

from flowrl.eval.sample import ode_sample
from flowrl.policies.hunyuan15 import Config, HunyuanVideo15Policy
from tests.policies.conftest import generators, pipeline_step_velocities

PROMPTS = ['a sign that says "hello"', "a cat walking on the beach"]     # one with glyph text (ByT5), one without
H = W = 16
F = 5
L = 300            # Qwen tokens kept (the tiny tokenizer's template is ~240 tokens past the 108 cropped)


def _perturb(policy, name, scale, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.adapter_parameters(name):
            p.add_(scale * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    policy = HunyuanVideo15Policy.tiny(seed=0, config=Config(max_sequence_length=L))
    _perturb(policy, "train", 0.05, 1)
    return policy, policy.save_pretrained(tmp_path_factory.mktemp("hy15"))


def _pipe(path, guidance, rescale=0.0):
    from diffusers import HunyuanVideo15Pipeline
    from diffusers.guiders import ClassifierFreeGuidance

    pipe = HunyuanVideo15Pipeline.from_pretrained(path)
    pipe.tokenizer_max_length = L
    pipe.guider = ClassifierFreeGuidance(guidance_scale=guidance, guidance_rescale=rescale)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("guidance", [6.0])
def test_velocity_matches_pipeline(saved, guidance):
    policy, path = saved
    pipe = _pipe(path, guidance)
    x = policy.noise(generators(2), H, W, F)
    assert x.shape == (2, 4, 3, 4, 4)
    sig, xs, vs = pipeline_step_velocities(pipe, x, 2, prompt=PROMPTS, height=H, width=W, num_frames=F)
    assert torch.equal(policy.sigmas(2, x), sig)
    cond = policy.encode(PROMPTS, cfg=guidance > 1)
    assert cond.embeds["encoder_attention_mask_2"][0].sum() > 0 == cond.embeds["encoder_attention_mask_2"][1].sum()
    assert (cond.embeds["encoder_attention_mask"].sum(1) < L).all()        # the prompts fit: nothing truncated
    with torch.no_grad(), policy.adapter(None):
        for i in range(2):
            torch.testing.assert_close(policy.velocity(xs[i], sig[i], cond, guidance), vs[i], atol=1e-5, rtol=0)


def test_guider_rescale_is_reproduced(saved):
    policy, path = saved
    pipe = _pipe(path, 6.0, rescale=0.7)
    policy.pipe.guider = pipe.guider
    try:
        x = policy.noise(generators(2), H, W, F)
        sig, xs, vs = pipeline_step_velocities(pipe, x, 1, prompt=PROMPTS, height=H, width=W, num_frames=F)
        with torch.no_grad(), policy.adapter(None):
            torch.testing.assert_close(policy.velocity(xs[0], sig[0], policy.encode(PROMPTS), 6.0), vs[0],
                                       atol=1e-5, rtol=0)
    finally:
        policy.pipe.guider = HunyuanVideo15Policy.from_pretrained(str(path), dtype=torch.float32).pipe.guider


def test_lora_export_rollout_and_decode_match_the_pipeline(saved, tmp_path):
    """No LoRA loader mixin on the pipeline in 0.42.1: the export loads through transformer.load_lora_adapter."""
    from flowrl.policies.export import save_diffusers_lora

    policy, path = saved
    file = save_diffusers_lora(policy, tmp_path)
    pipe = _pipe(path, 6.0)
    pipe.transformer.load_lora_adapter(str(file.parent), weight_name=file.name, prefix="transformer")
    x = policy.noise(generators(2), H, W, F)
    kw = {"prompt": PROMPTS, "latents": x.clone(), "num_inference_steps": 3, "height": H, "width": W,
          "num_frames": F}
    with torch.no_grad():
        ours = ode_sample(policy, x, policy.encode(PROMPTS), 3, 6.0)
        torch.testing.assert_close(ours, pipe(output_type="latent", **kw).frames, atol=1e-5, rtol=0)
        one = {**kw, "prompt": PROMPTS[:1], "latents": x[:1].clone()}      # the VAE decodes batches of one
        video = pipe(output_type="pt", **one).frames.float()
        torch.testing.assert_close(policy.decode(torch.cat([ours[:1], ours[:1]])), video.expand(2, -1, -1, -1, -1),
                                   atol=1e-5, rtol=0)
        with policy.adapter(None):
            assert (ode_sample(policy, x, policy.encode(PROMPTS), 3, 6.0) - ours).abs().max() > 1e-4


def test_save_load_round_trip_and_defaults(saved):
    policy, path = saved
    again = HunyuanVideo15Policy.from_pretrained(str(path), dtype=torch.float32)
    assert (again.family, again.default_guidance, again.config.guidance) == ("hunyuan15", 6.0, None)
    x = policy.noise(generators(2), H, W, F)
    cond, cond2 = policy.encode(PROMPTS), again.encode(PROMPTS)
    with torch.no_grad():
        for name in ("train", "old", None):
            with policy.adapter(name), again.adapter(name):
                assert torch.equal(policy.velocity(x, 0.4, cond), again.velocity(x, 0.4, cond2))
    units = policy.shard_units()
    assert [type(b).__name__ for b in units[0][1]] == ["HunyuanVideo15TransformerBlock"] * 2


def test_full_fine_tune_and_sde_log_prob(saved):
    from samplers import KERNELS

    full = HunyuanVideo15Policy.tiny(seed=0, config=Config(lora=None, max_sequence_length=L))
    assert len(full.trainable_parameters()) == len(list(full.transformer.parameters()))
    assert len(full.shard_units()) == 3
    policy, _ = saved
    x = policy.noise(generators(2), H, W, F)
    with torch.no_grad():
        v = policy.velocity(x, 0.8, policy.encode(PROMPTS))
    k = KERNELS.get("flow_sde")
    out = k.step(x, v, 0.8, 0.6, torch.randn_like(x), cfg=k.config())
    ref = torch.distributions.Normal(out.mean, out.std.view(-1, 1, 1, 1, 1)).log_prob(out.x_next).sum((1, 2, 3, 4))
    torch.testing.assert_close(k.log_prob(out.x_next, out.mean, out.std, "sum", k.config()), ref,
                               rtol=1e-5, atol=1e-3)
