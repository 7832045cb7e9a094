"""WanPolicy against diffusers' WanPipeline on the tiny preset (same components, same latents)."""
import pytest
import torch

from flowrl.policies.wan import Config, WanPolicy, euler_scheduler_from_config
from tests.policies.conftest import generators, pipeline_step_velocities

PROMPTS = ["dance monkey", "a cat walking on the beach"]
H = W = 16
F = 9


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    policy = WanPolicy.tiny(seed=0, config=Config(max_sequence_length=16))
    return policy, policy.save_pretrained(tmp_path_factory.mktemp("wan"))


@pytest.fixture(scope="module")
def pipe(saved):
    from diffusers import WanPipeline

    return WanPipeline.from_pretrained(saved[1])


@pytest.mark.parametrize("guidance", [1.0, 5.0])
def test_velocity_matches_pipeline(saved, pipe, guidance):
    policy, _ = saved
    x = policy.noise(generators(2), H, W, F)
    assert x.shape == (2, 16, 3, 2, 2)
    sig, xs, vs = pipeline_step_velocities(pipe, x, 2, prompt=PROMPTS, guidance_scale=guidance, height=H, width=W,
                                           num_frames=F, max_sequence_length=16)
    assert torch.equal(policy.sigmas(2, x), sig)
    cond = policy.encode(PROMPTS, cfg=guidance > 1)
    with torch.no_grad(), policy.adapter(None):
        for i in range(2):
            torch.testing.assert_close(policy.velocity(xs[i], sig[i], cond, guidance), vs[i], atol=1e-5, rtol=0)


def test_decode_matches_pipeline(saved, pipe):
    policy, _ = saved
    x = policy.noise(generators(1), H, W, F)
    pipe.set_progress_bar_config(disable=True)
    kw = {"prompt": PROMPTS[:1], "num_inference_steps": 1, "guidance_scale": 1.0, "height": H, "width": W,
          "num_frames": F, "max_sequence_length": 16}
    video = pipe(latents=x.clone(), output_type="pt", **kw).frames
    final = pipe(latents=x.clone(), output_type="latent", **kw).frames
    out = policy.decode(final)
    assert out.shape == (1, F, 3, H, W)
    torch.testing.assert_close(out, video.float(), atol=1e-5, rtol=0)


def test_unipc_scheduler_config_maps_to_euler_shift(tmp_path):
    """The Wan2.1 hub repos ship UniPC(flow_shift=3); flowrl's grid is flow-match Euler with that shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0).save_pretrained(
        tmp_path / "scheduler")
    euler = euler_scheduler_from_config(FlowMatchEulerDiscreteScheduler.load_config(tmp_path, subfolder="scheduler"))
    assert type(euler).__name__ == "FlowMatchEulerDiscreteScheduler" and euler.config.shift == 3.0


def test_shape_errors(saved):
    policy, _ = saved
    with pytest.raises(ValueError, match="num_frames"):
        policy.latent_shape(H, W)
    with pytest.raises(ValueError, match="divisible by 4"):
        policy.latent_shape(H, W, 8)


def test_save_load_round_trip(saved):
    policy, path = saved
    with torch.no_grad():
        for p in policy.adapter_parameters("train"):
            p.add_(0.05 * torch.randn_like(p))
    out = policy.save_pretrained(path)
    again = WanPolicy.from_pretrained(str(out), dtype=torch.float32)
    x = policy.noise(generators(2), H, W, F)
    cond, cond2 = policy.encode(PROMPTS), again.encode(PROMPTS)
    with torch.no_grad():
        for name in ("train", "old", None):
            with policy.adapter(name), again.adapter(name):
                assert torch.equal(policy.velocity(x, 0.4, cond), again.velocity(x, 0.4, cond2))


def test_satisfies_policy_protocol(saved):
    from flowrl.policies.base import Policy

    policy, _ = saved
    assert isinstance(policy, Policy)
    assert (policy.family, policy.default_guidance) == ("wan", 5.0)


def test_load_in_bfloat16_keeps_vae_float32(saved):
    policy, path = saved
    bf = WanPolicy.from_pretrained(str(path), dtype=torch.bfloat16)
    assert bf.transformer.dtype == torch.bfloat16 and bf.vae.dtype == torch.float32
    assert bf.pipe.text_encoder.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in bf.trainable_parameters())
    x = policy.noise(generators(1), H, W, F)
    with torch.no_grad():
        v32 = policy.velocity(x, 0.5, policy.encode(PROMPTS[:1]))
        v16 = bf.velocity(x, 0.5, bf.encode(PROMPTS[:1]))
    assert v16.dtype == torch.float32
    assert (v16 - v32).abs().max() < 0.1 * v32.abs().max() + 0.05
