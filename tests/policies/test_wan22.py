"""Wan2.2 policies against diffusers' WanPipeline / WanImageToVideoPipeline on tiny presets (float32, offline):
the A14B expert boundary, I2V channel conditioning, TI2V's per-token timesteps and first-frame conditioning,
save/load, LoRA export into both experts, SDE log-probs."""
import pytest
import torch

from flowrl.eval.sample import ode_sample
from flowrl.policies.wan22 import EXPERTS, Config, Wan22I2VPolicy, Wan22Policy, Wan22TI2VPolicy
from tests.policies.conftest import generators, pipeline_step_velocities

PROMPTS = ["dance monkey", "a cat walking on the beach"]
F = 5
STEPS = 3          # tiny scheduler shift 7: σ·1000 = 1000, 933, 778 → two high-noise steps, one low-noise (0.875)
KW = {"num_frames": F, "max_sequence_length": 16}


def _perturb(policy, name, scale, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.adapter_parameters(name):
            p.add_(scale * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def a14b(tmp_path_factory):
    """Both experts trained (LoRA), distinct "train" adapters, low-noise CFG 3.0; saved; the stock pipeline."""
    from diffusers import WanPipeline

    policy = Wan22Policy.tiny(config=Config(max_sequence_length=16, guidance_2=3.0, train_experts=EXPERTS))
    _perturb(policy, "train", 0.05, 1)
    path = policy.save_pretrained(tmp_path_factory.mktemp("wan22"))
    return policy, path, WanPipeline.from_pretrained(path)


def test_steps_on_both_sides_of_the_boundary_match_the_pipeline(a14b):
    policy, path, pipe = a14b
    x = policy.noise(generators(2), 16, 16, F)
    sig, xs, vs = pipeline_step_velocities(pipe, x, STEPS, prompt=PROMPTS, guidance_scale=5.0, guidance_scale_2=3.0,
                                           height=16, width=16, **KW)
    t = sig[:STEPS] * 1000
    assert (t >= 875).any() and (t < 875).any()
    cond = policy.encode(PROMPTS)
    with torch.no_grad(), policy.adapter(None):
        for i in range(STEPS):
            torch.testing.assert_close(policy.velocity(xs[i], sig[i], cond, 5.0), vs[i], atol=1e-5, rtol=0)
        mixed = policy.velocity(xs[0], torch.stack([sig[0], sig[2]]), cond, 5.0)     # one row per expert
        torch.testing.assert_close(mixed[1], policy.velocity(xs[0][1:], sig[2], cond.select([1]), 5.0)[0])
        torch.testing.assert_close(mixed[0], vs[0][0], atol=1e-5, rtol=0)


def _lora(policy, out):
    from flowrl.policies.export import save_diffusers_lora

    save_diffusers_lora(policy, out)
    return out / "transformer"


def test_exported_lora_in_both_experts_reproduces_the_ode_rollout(a14b, tmp_path):
    """Export → stock pipeline with LoRA loaded into transformer and transformer_2 → same final latents."""
    from diffusers import WanPipeline

    policy, path, _ = a14b
    _lora(policy, tmp_path)
    pipe = WanPipeline.from_pretrained(path)
    pipe.load_lora_weights(tmp_path / "transformer")
    pipe.load_lora_weights(tmp_path / "transformer_2", load_into_transformer_2=True)
    pipe.set_progress_bar_config(disable=True)
    x = policy.noise(generators(2), 16, 16, F)
    with torch.no_grad():
        ours = ode_sample(policy, x, policy.encode(PROMPTS), STEPS, 5.0)
        theirs = pipe(prompt=PROMPTS, latents=x.clone(), num_inference_steps=STEPS, guidance_scale=5.0,
                      guidance_scale_2=3.0, height=16, width=16, output_type="latent", **KW).frames
        with policy.adapter(None):
            base = ode_sample(policy, x, policy.encode(PROMPTS), STEPS, 5.0)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    assert (base - ours).abs().max() > 1e-4


def test_save_load_round_trip_and_weight_sets(a14b):
    policy, path, _ = a14b
    again = Wan22Policy.from_pretrained(str(path), dtype=torch.float32)
    assert again.boundary == 875.0 and again.config.train_experts == EXPERTS
    x = policy.noise(generators(2), 16, 16, F)
    cond, cond2 = policy.encode(PROMPTS), again.encode(PROMPTS)
    keys = policy.adapter_state_dict("train").keys()
    assert {k.split(".")[0] for k in keys} == set(EXPERTS)
    assert [type(m).__name__ for m, _ in policy.shard_units()] == ["WanTransformer3DModel"] * 2
    assert all(len(blocks) == 2 for _, blocks in policy.shard_units())
    with torch.no_grad():
        for name in ("train", "old", None):
            with policy.adapter(name), again.adapter(name):
                for s in (0.95, 0.3):
                    assert torch.equal(policy.velocity(x, s, cond), again.velocity(x, s, cond2))


def test_one_trained_expert_and_full_fine_tune():
    """The anchor's default trains ``transformer`` only: ``transformer_2`` is frozen, its base under every set."""
    lora_policy = Wan22Policy.tiny(config=Config(max_sequence_length=8))
    assert {k.split(".")[0] for k in lora_policy.adapter_state_dict("train")} == {"transformer"}
    assert len(lora_policy.shard_units()) == 2
    full = Wan22Policy.tiny(config=Config(max_sequence_length=8, lora=None, train_experts=EXPERTS))
    assert len(full.trainable_parameters()) == 2 * len(list(full.weights.experts["transformer"].parameters()))
    assert len(full.shard_units()) == 6            # two experts × (train, old, base)
    with torch.no_grad():
        for p in full.trainable_parameters():
            p.add_(0.01)
    x = full.noise(generators(1), 16, 16, F)
    cond = full.encode(PROMPTS[:1], cfg=False)
    with torch.no_grad():
        for s in (0.95, 0.3):
            v_train = full.velocity(x, s, cond)
            with full.adapter("old"):
                assert (full.velocity(x, s, cond) - v_train).abs().max() > 1e-4
    full.copy_adapter("train", "old")
    with torch.no_grad(), full.adapter("old"):
        assert torch.equal(full.velocity(x, 0.3, cond), v_train)


def test_sde_log_prob_on_wan22_latents_is_normal_log_prob(a14b):
    from samplers import KERNELS

    policy, _, _ = a14b
    x = policy.noise(generators(2), 16, 16, F)
    with torch.no_grad():
        v = policy.velocity(x, 0.9, policy.encode(PROMPTS), 5.0)
    k = KERNELS.get("flow_sde")
    out = k.step(x, v, 0.9, 0.8, torch.randn_like(x), cfg=k.config())
    ref = torch.distributions.Normal(out.mean, out.std.view(-1, 1, 1, 1, 1)).log_prob(out.x_next).mean((1, 2, 3, 4))
    torch.testing.assert_close(k.log_prob(out.x_next, out.mean, out.std, "mean", k.config()), ref,
                               rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------------------------- image to video

def _image(h, w, seed=3):
    return torch.rand(3, h, w, generator=torch.Generator().manual_seed(seed))


def test_i2v_a14b_step_matches_the_pipeline(tmp_path):
    from diffusers import WanImageToVideoPipeline

    policy = Wan22I2VPolicy.tiny(config=Config(max_sequence_length=16))
    pipe = WanImageToVideoPipeline.from_pretrained(policy.save_pretrained(tmp_path))
    assert Wan22I2VPolicy.accepts_images and pipe.transformer.config.in_channels == 36
    img = _image(16, 16)
    x = policy.noise(generators(2), 16, 16, F)
    sig, xs, vs = pipeline_step_velocities(pipe, x, STEPS, prompt=PROMPTS, image=img[None], guidance_scale=4.0,
                                           height=16, width=16, **KW)
    cond = policy.encode(PROMPTS, images=[[img], [img]])
    with torch.no_grad():
        for i in range(STEPS):
            torch.testing.assert_close(policy.velocity(xs[i], sig[i], cond, 4.0), vs[i], atol=1e-5, rtol=0)
    assert cond.embeds["image_condition"].shape == (2, 20, *x.shape[2:])
    with pytest.raises(ValueError, match="image"):
        policy.encode(PROMPTS)


@pytest.fixture(scope="module")
def ti2v(tmp_path_factory):
    policy = Wan22TI2VPolicy.tiny(config=Config(max_sequence_length=16))
    return policy, policy.save_pretrained(tmp_path_factory.mktemp("ti2v"))


def test_ti2v_text_to_video_steps_and_decode_match_the_pipeline(ti2v):
    from diffusers import WanPipeline

    policy, path = ti2v
    pipe = WanPipeline.from_pretrained(path)
    assert pipe.config.expand_timesteps and policy.vae.config.z_dim == 48
    x = policy.noise(generators(2), 32, 32, F)
    assert x.shape == (2, 48, 2, 2, 2)
    sig, xs, vs = pipeline_step_velocities(pipe, x, 2, prompt=PROMPTS, guidance_scale=5.0, height=32, width=32, **KW)
    cond = policy.encode(PROMPTS)
    with torch.no_grad():
        for i in range(2):
            torch.testing.assert_close(policy.velocity(xs[i], sig[i], cond, 5.0), vs[i], atol=1e-5, rtol=0)
        video = pipe(prompt=PROMPTS[:1], latents=x[:1].clone(), num_inference_steps=1, guidance_scale=1.0,
                     height=32, width=32, output_type="pt", **KW).frames
        final = pipe(prompt=PROMPTS[:1], latents=x[:1].clone(), num_inference_steps=1, guidance_scale=1.0,
                     height=32, width=32, output_type="latent", **KW).frames
        torch.testing.assert_close(policy.decode(final), video.float(), atol=1e-5, rtol=0)


def test_ti2v_first_frame_conditioning_matches_the_pipeline(ti2v):
    """Noisy frames: the pipeline's velocity; the clean first frame: (x − c)/σ, so the rollout ends on c exactly
    where the pipeline overwrites it — final latents equal."""
    from diffusers import WanImageToVideoPipeline

    policy, path = ti2v
    pipe = WanImageToVideoPipeline.from_pretrained(path)
    img = _image(32, 32)
    x = policy.noise(generators(2), 32, 32, F)
    sig, xs, vs = pipeline_step_velocities(pipe, x, 2, prompt=PROMPTS, image=img[None], guidance_scale=5.0,
                                           height=32, width=32, **KW)
    cond = policy.encode(PROMPTS, images=[[img], [img]])
    with torch.no_grad():
        v = policy.velocity(xs[0], sig[0], cond, 5.0)
        torch.testing.assert_close(v[:, :, 1:], vs[0][:, :, 1:], atol=1e-5, rtol=0)
        ours = ode_sample(policy, x, cond, 2, 5.0)
        pipe.set_progress_bar_config(disable=True)
        theirs = pipe(prompt=PROMPTS, image=img[None], latents=x.clone(), num_inference_steps=2, guidance_scale=5.0,
                      height=32, width=32, output_type="latent", **KW).frames
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
        mixed = policy.encode(PROMPTS, images=[[img], None])          # row 1 is text-to-video
        t2v = policy.velocity(xs[0], sig[0], policy.encode(PROMPTS), 5.0)
        torch.testing.assert_close(policy.velocity(xs[0], sig[0], mixed, 5.0)[1], t2v[1], atol=1e-6, rtol=0)
