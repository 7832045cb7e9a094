"""SD3Policy against diffusers' StableDiffusion3Pipeline on the tiny preset (same components, same latents)."""
import pytest
import torch

from flowrl.policies.sd3 import Config, SD3Policy
from tests.policies.conftest import generators, pipeline_step_velocities

PROMPTS = ["a red circle left of a blue square", "a photo of a cat"]
H = W = 16


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny SD3 preset on disk (diffusers layout) and the policy that wrote it."""
    policy = SD3Policy.tiny(seed=0, config=Config(max_sequence_length=16))
    path = policy.save_pretrained(tmp_path_factory.mktemp("sd3"))
    return policy, path


@pytest.fixture(scope="module")
def pipe(saved):
    from diffusers import StableDiffusion3Pipeline

    return StableDiffusion3Pipeline.from_pretrained(saved[1])


@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_velocity_matches_pipeline(saved, pipe, guidance):
    policy, _ = saved
    x = policy.noise(generators(2), H, W)
    sig, xs, vs = pipeline_step_velocities(pipe, x, 2, prompt=PROMPTS, guidance_scale=guidance,
                                           max_sequence_length=16)
    assert torch.equal(policy.sigmas(2, x), sig)
    cond = policy.encode(PROMPTS, cfg=guidance > 1)
    with policy.adapter(None):
        for i in range(2):
            v = policy.velocity(xs[i], sig[i], cond, guidance)
            assert v.dtype == torch.float32
            torch.testing.assert_close(v, vs[i], atol=1e-5, rtol=0)


def test_cfg_changes_velocity_and_negative_prompts(saved):
    policy, _ = saved
    x = policy.noise(generators(2), H, W)
    cond = policy.encode(PROMPTS)
    v1, v45 = policy.velocity(x, 0.7, cond, 1.0), policy.velocity(x, 0.7, cond, 4.5)
    assert (v1 - v45).abs().max() > 1e-4
    neg = policy.encode(PROMPTS, negative_prompts=["blurry", "dark"])
    assert not torch.equal(neg.uncond["prompt_embeds"], cond.uncond["prompt_embeds"])
    with pytest.raises(ValueError, match="cfg=True"):
        policy.velocity(x, 0.7, policy.encode(PROMPTS, cfg=False), 4.5)


def test_noise_rows_come_from_their_generator(saved):
    policy, _ = saved
    both = policy.noise(generators(2), H, W)
    alone = policy.noise(generators(1, seed=1), H, W)
    assert both.shape == (2, 4, H, W) and both.dtype == torch.float32
    assert torch.equal(both[1:], alone)


def test_decode_matches_pipeline(saved, pipe):
    policy, _ = saved
    x = policy.noise(generators(1), H, W)
    pipe.set_progress_bar_config(disable=True)
    img = pipe(prompt=PROMPTS[:1], latents=x.clone(), num_inference_steps=1, guidance_scale=1.0,
               max_sequence_length=16, output_type="pt").images
    final = pipe(prompt=PROMPTS[:1], latents=x.clone(), num_inference_steps=1, guidance_scale=1.0,
                 max_sequence_length=16, output_type="latent").images
    out = policy.decode(final)
    assert out.shape == (1, 3, H, W) and out.min() >= 0 and out.max() <= 1
    torch.testing.assert_close(out, img.float(), atol=1e-5, rtol=0)


def test_save_load_round_trip_with_adapters(tmp_path):
    policy = SD3Policy.tiny(seed=3, config=Config(max_sequence_length=16))
    with torch.no_grad():
        for p in policy.adapter_parameters("train"):
            p.add_(0.05 * torch.randn_like(p))
        for p in policy.adapter_parameters("old"):
            p.add_(0.02 * torch.randn_like(p))
    policy.save_pretrained(tmp_path)
    again = SD3Policy.from_pretrained(str(tmp_path), dtype=torch.float32)
    x, cond = policy.noise(generators(2), H, W), policy.encode(PROMPTS)
    cond2 = again.encode(PROMPTS)
    torch.testing.assert_close(cond2.embeds, cond.embeds, atol=0, rtol=0)
    for name in ("train", "old", None):
        with policy.adapter(name), again.adapter(name):
            assert torch.equal(policy.velocity(x, 0.6, cond), again.velocity(x, 0.6, cond2))


def test_latent_shape_checks(saved):
    policy, _ = saved
    assert policy.latent_shape(16, 24) == (4, 16, 24)
    with pytest.raises(ValueError, match="num_frames"):
        policy.latent_shape(16, 16, num_frames=5)


def test_policy_adapters_and_gradients():
    policy = SD3Policy.tiny(seed=1, config=Config(max_sequence_length=16))
    x, cond = policy.noise(generators(2), H, W), policy.encode(PROMPTS)
    before = {}
    for name in ("train", "old", None):
        with torch.no_grad(), policy.adapter(name):
            before[name] = policy.velocity(x, 0.5, cond)
    with torch.no_grad():
        for p in policy.adapter_parameters("train")[1::2]:   # lora_B starts at 0: move it
            p.add_(0.1 * torch.randn_like(p))
    with torch.no_grad():
        assert (policy.velocity(x, 0.5, cond) - before["train"]).abs().max() > 1e-4
        for name in ("old", None):
            with policy.adapter(name):
                assert torch.equal(policy.velocity(x, 0.5, cond), before[name])
    policy.velocity(x, 0.5, cond).square().mean().backward()
    trainable = {id(p) for p in policy.trainable_parameters()}
    for n, p in policy.transformer.named_parameters():
        assert (p.grad is not None) == (id(p) in trainable), n
    policy.soft_update_adapter(0.0)   # decay 0: old ← train
    assert all(torch.equal(a, b) for a, b in zip(policy.adapter_parameters("old"),
                                                   policy.adapter_parameters("train")))


def test_satisfies_policy_protocol(saved):
    from flowrl.policies.base import Policy

    policy, _ = saved
    assert isinstance(policy, Policy)
    assert (policy.family, policy.default_guidance) == ("sd3", 4.5)


def test_full_finetune_mode_on_policy():
    policy = SD3Policy.tiny(seed=2, config=Config(max_sequence_length=16, lora=None))
    assert policy.trainable_parameters() == list(policy.transformer.parameters())
    x, cond = policy.noise(generators(1), H, W), policy.encode(PROMPTS[:1])
    with torch.no_grad():
        base = policy.velocity(x, 0.5, cond)
        for p in policy.trainable_parameters():
            p.add_(0.01 * torch.randn_like(p))
        assert (policy.velocity(x, 0.5, cond) - base).abs().max() > 1e-4
        for name in ("old", None):
            with policy.adapter(name):
                torch.testing.assert_close(policy.velocity(x, 0.5, cond), base, atol=0, rtol=0)


def test_gradient_checkpointing_gives_the_same_gradients():
    grads = []
    for ckpt in (False, True):
        policy = SD3Policy.tiny(seed=4, config=Config(max_sequence_length=16, gradient_checkpointing=ckpt))
        policy.transformer.train()
        with torch.no_grad():
            for p in policy.adapter_parameters("train"):
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        x, cond = policy.noise(generators(1), H, W), policy.encode(PROMPTS[:1])
        policy.velocity(x, 0.5, cond).square().mean().backward()
        grads.append([p.grad.clone() for p in policy.trainable_parameters()])
    assert policy.transformer.gradient_checkpointing
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_bfloat16_model_returns_float32_close_to_float32():
    from flowrl.policies.tiny import sd3_components

    cfg = Config(max_sequence_length=16)
    p32 = SD3Policy(sd3_components(0), cfg, "cpu", torch.float32)
    p16 = SD3Policy(sd3_components(0), cfg, "cpu", torch.bfloat16)
    assert p16.transformer.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in p16.trainable_parameters())
    x, cond = p32.noise(generators(1), H, W), p32.encode(PROMPTS[:1])
    with torch.no_grad():
        v32, v16 = p32.velocity(x, 0.5, cond), p16.velocity(x, 0.5, cond)
    assert v16.dtype == torch.float32
    assert (v16 - v32).abs().max() < 0.1 * v32.abs().max()


def test_bad_sigma_shape(saved):
    policy, _ = saved
    x, cond = policy.noise(generators(2), H, W), policy.encode(PROMPTS, cfg=False)
    with pytest.raises(ValueError, match="sigma"):
        policy.velocity(x, torch.ones(3), cond)


def test_loading_another_familys_directory_is_a_clear_error(saved):
    from flowrl.policies.flux import FluxPolicy

    with pytest.raises(ValueError, match="'sd3' policy"):
        FluxPolicy.from_pretrained(str(saved[1]), dtype=torch.float32)


def test_save_preset_loads_through_the_real_path(tmp_path):
    from flowrl.policies.tiny import save_preset

    path = save_preset("sd3", tmp_path, seed=0)
    assert (path / "model_index.json").is_file() and (path / "adapters" / "train.safetensors").is_file()
    loaded = SD3Policy.from_pretrained(str(path), dtype=torch.float32)
    assert loaded.config.max_sequence_length == 256
    with pytest.raises(ValueError, match="tiny presets"):
        save_preset("toy", tmp_path)


@pytest.mark.parametrize("steps", [1, 10, 40])
def test_sigmas_equal_the_scheduler(saved, steps):
    from diffusers import FlowMatchEulerDiscreteScheduler

    policy, _ = saved
    sched = FlowMatchEulerDiscreteScheduler.from_config(policy.scheduler_config)
    sched.set_timesteps(steps)
    assert torch.equal(policy.sigmas(steps, torch.zeros(1, 4, H, W)), sched.sigmas)
