"""FluxPolicy against diffusers' FluxPipeline on the tiny preset (same components, same latents)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl.policies.flux import Config, FluxPolicy, latent_image_ids, pack_latents, unpack_latents
from tests.policies.conftest import generators, pipeline_step_velocities

PROMPTS = ["a red circle left of a blue square", "a photo of a cat"]
H = W = 8


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    policy = FluxPolicy.tiny(seed=0, config=Config(max_sequence_length=16, true_cfg=2.0))
    return policy, policy.save_pretrained(tmp_path_factory.mktemp("flux"))


@pytest.fixture(scope="module")
def pipe(saved):
    from diffusers import FluxPipeline

    return FluxPipeline.from_pretrained(saved[1])


def test_pack_unpack_match_diffusers():
    from diffusers import FluxPipeline

    x = torch.randn(2, 3, 6, 4)
    packed = pack_latents(x)
    assert torch.equal(packed, FluxPipeline._pack_latents(x, 2, 3, 6, 4))
    assert torch.equal(unpack_latents(packed, 6, 4), x)
    assert torch.equal(latent_image_ids(6, 4), FluxPipeline._prepare_latent_image_ids(2, 3, 2, "cpu", torch.float32))


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 3), c=st.integers(1, 4), h=st.integers(1, 5), w=st.integers(1, 5))
def test_pack_is_an_invertible_permutation(b, c, h, w):
    x = torch.arange(b * c * 4 * h * w, dtype=torch.float32).view(b, c, 2 * h, 2 * w)
    packed = pack_latents(x)
    assert packed.shape == (b, h * w, 4 * c)
    assert torch.equal(packed.flatten().sort().values, x.flatten())
    assert torch.equal(unpack_latents(packed, 2 * h, 2 * w), x)


@pytest.mark.parametrize("guidance,true_cfg", [(1.0, 1.0), (3.5, 1.0), (3.5, 2.0)])
def test_velocity_matches_pipeline(saved, pipe, guidance, true_cfg):
    policy, _ = saved
    policy.config.true_cfg = true_cfg
    x = policy.noise(generators(2), H, W)
    neg = ["blurry", "dark"] if true_cfg > 1 else None
    sig, xs, vs = pipeline_step_velocities(pipe, pack_latents(x), 2, prompt=PROMPTS, guidance_scale=guidance,
                                           true_cfg_scale=true_cfg, negative_prompt=neg, height=H, width=W,
                                           max_sequence_length=16)
    assert torch.equal(policy.sigmas(2, x), sig)
    cond = policy.encode(PROMPTS, negative_prompts=neg)
    assert (cond.uncond is None) == (true_cfg == 1.0)
    with torch.no_grad(), policy.adapter(None):
        for i in range(2):
            v = policy.velocity(unpack_latents(xs[i], H, W), sig[i], cond, guidance)
            torch.testing.assert_close(v, unpack_latents(vs[i], H, W), atol=1e-5, rtol=0)
    policy.config.true_cfg = 2.0


def test_guidance_embedding_is_used(saved):
    policy, _ = saved
    x, cond = policy.noise(generators(1), H, W), policy.encode(PROMPTS[:1], cfg=False)
    with torch.no_grad():
        assert (policy.velocity(x, 0.5, cond, 1.0) - policy.velocity(x, 0.5, cond, 3.5)).abs().max() > 1e-5


def test_noise_matches_pipeline_draw(saved):
    from diffusers.utils.torch_utils import randn_tensor

    policy, _ = saved
    shape = (2, *policy.latent_shape(H, W))
    assert torch.equal(policy.noise(generators(2), H, W), randn_tensor(shape, generator=generators(2)))
    with pytest.raises(ValueError, match="multiples"):
        policy.latent_shape(9, 8)


def test_decode_matches_pipeline(saved, pipe):
    policy, _ = saved
    x = policy.noise(generators(1), H, W)
    pipe.set_progress_bar_config(disable=True)
    kw = {"prompt": PROMPTS[:1], "num_inference_steps": 1, "height": H, "width": W, "max_sequence_length": 16}
    img = pipe(latents=pack_latents(x), output_type="pt", **kw).images
    final = pipe(latents=pack_latents(x), output_type="latent", **kw).images
    torch.testing.assert_close(policy.decode(unpack_latents(final, H, W)), img.float(), atol=1e-5, rtol=0)


def test_save_load_round_trip(saved):
    policy, path = saved
    with torch.no_grad():
        for p in policy.adapter_parameters("train"):
            p.add_(0.05 * torch.randn_like(p))
    out = policy.save_pretrained(path)
    again = FluxPolicy.from_pretrained(str(out), dtype=torch.float32)
    assert again.config.lora.rank == 64 and again.config.true_cfg == policy.config.true_cfg
    x, cond = policy.noise(generators(2), H, W), policy.encode(PROMPTS)
    with torch.no_grad():
        for name in ("train", "old", None):
            with policy.adapter(name), again.adapter(name):
                assert torch.equal(policy.velocity(x, 0.4, cond), again.velocity(x, 0.4, again.encode(PROMPTS)))


def test_satisfies_policy_protocol(saved):
    from flowrl.policies.base import Policy

    policy, _ = saved
    assert isinstance(policy, Policy)
    assert (policy.family, policy.default_guidance) == ("flux", 3.5)
    assert (policy.config.lora.rank, policy.config.lora.alpha) == (64, 128)


@pytest.mark.parametrize("steps,size", [(6, 8), (28, 16), (28, 64)])
def test_sigmas_equal_the_pipeline_recipe(saved, steps, size):
    """FluxPipeline step 5: sigmas = linspace(1, 1/N, N), μ = calculate_shift(image_seq_len), set_timesteps."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    policy, _ = saved
    latents = torch.zeros(1, *policy.latent_shape(size, size))
    sched = FlowMatchEulerDiscreteScheduler.from_config(policy.scheduler_config)
    mu = calculate_shift(latents.shape[-1] * latents.shape[-2] // 4, 256, 4096, 0.5, 1.15)
    sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    assert torch.equal(policy.sigmas(steps, latents), sched.sigmas)
