"""The ODE rollout through the tiny SD3, FLUX and Wan policies reproduces the matching diffusers pipeline's
final latents (same components, prompts → embeddings, starting latents, step count and guidance) to 1e-5."""
import pytest
import torch

from samplers.rng import sample_generator
from samplers.rollout import rollout

PROMPTS = ["a red circle left of a blue square", "a photo of a cat"]
STEPS = 4


def _gens(n):
    return [sample_generator(0, 0, 0, i) for i in range(n)]


def _flowrl_latents(policy, x1, guidance):
    cond = policy.encode(PROMPTS, cfg=guidance > 1)
    sigmas = policy.sigmas(STEPS, x1)
    with torch.no_grad(), policy.adapter(None):
        res = rollout(lambda x, s: policy.velocity(x, s, cond, guidance), x1, sigmas)
    assert res.nfe == STEPS
    return res.latents


def _fresh_pipeline(policy):
    pipe = type(policy.pipe)(**policy.pipe.components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_sd3_ode_rollout_equals_pipeline(guidance):
    from flowrl.policies.sd3 import Config, SD3Policy

    policy = SD3Policy.tiny(seed=0, config=Config(max_sequence_length=16))
    x1 = policy.noise(_gens(2), 16, 16)
    with torch.no_grad(), policy.adapter(None):
        ref = _fresh_pipeline(policy)(prompt=PROMPTS, latents=x1.clone(), num_inference_steps=STEPS,
                                      guidance_scale=guidance, output_type="latent", max_sequence_length=16).images
    torch.testing.assert_close(_flowrl_latents(policy, x1, guidance), ref.float(), atol=1e-5, rtol=0)


def test_flux_ode_rollout_equals_pipeline():
    from flowrl.policies.flux import Config, FluxPolicy, pack_latents

    policy = FluxPolicy.tiny(seed=0, config=Config(max_sequence_length=16))
    x1 = policy.noise(_gens(2), 8, 8)
    with torch.no_grad(), policy.adapter(None):
        ref = _fresh_pipeline(policy)(prompt=PROMPTS, latents=pack_latents(x1), num_inference_steps=STEPS,
                                      guidance_scale=3.5, height=8, width=8, output_type="latent",
                                      max_sequence_length=16).images
    torch.testing.assert_close(pack_latents(_flowrl_latents(policy, x1, 3.5)), ref.float(), atol=1e-5, rtol=0)


def test_wan_ode_rollout_equals_pipeline():
    from flowrl.policies.wan import Config, WanPolicy

    policy = WanPolicy.tiny(seed=0, config=Config(max_sequence_length=16))
    x1 = policy.noise(_gens(2), 16, 16, 9)
    with torch.no_grad(), policy.adapter(None):
        ref = _fresh_pipeline(policy)(prompt=PROMPTS, latents=x1.clone(), num_inference_steps=STEPS,
                                      guidance_scale=5.0, height=16, width=16, num_frames=9, output_type="latent",
                                      max_sequence_length=16).frames
    torch.testing.assert_close(_flowrl_latents(policy, x1, 5.0), ref.float(), atol=1e-5, rtol=0)
