"""Flux2Policy / Flux2KleinPolicy against diffusers' Flux2Pipeline / Flux2KleinPipeline on tiny presets (same
components, same latents, float32): step velocities (guidance embedding; true CFG), a reference image, the σ grid,
the full ODE, decode, save/load, export."""
import numpy as np
import pytest
import torch

from flowrl.eval.sample import ode_sample
from flowrl.policies.flux2 import Config, Flux2KleinPolicy, Flux2Policy, KleinConfig, pack, unpack
from tests.policies.conftest import assert_sde_log_probs_are_normal, generators, pipeline_step_velocities

PROMPTS = ["a red circle left of a blue square", "a photo of a cat"]
H = W = 8
SEQ = 16
R = 64                       # reference images: the pipeline's minimum side
FAMILIES = {"dev": (Flux2Policy, Config), "klein": (Flux2KleinPolicy, KleinConfig)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def policy(request):
    cls, config = FAMILIES[request.param]
    return cls.tiny(seed=0, config=config(max_sequence_length=SEQ))


def _kw(policy, **kw):
    return {"prompt": list(PROMPTS), "height": H, "width": W, "max_sequence_length": SEQ,
            "text_encoder_out_layers": tuple(policy.config.text_encoder_out_layers), **kw}


def _image(seed=0):
    """A reference image as the pipeline takes it (PIL) and as flowrl takes it ((3, H, W) in [0, 1])."""
    from PIL import Image

    a = np.random.default_rng(seed).integers(0, 256, (R, R, 3), dtype=np.uint8)
    return Image.fromarray(a), torch.from_numpy(a).permute(2, 0, 1).float() / 255


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_velocity_matches_pipeline(policy, guidance):
    x = policy.noise(generators(2), H, W)
    sig, xs, vs = pipeline_step_velocities(policy.pipe, x, 2, **_kw(policy, guidance_scale=guidance))
    assert torch.equal(policy.sigmas(2, x), sig)
    cond = policy.encode(PROMPTS)
    assert (cond.uncond is None) == (policy.family == "flux2")      # dev has no negative branch
    with torch.no_grad(), policy.adapter(None):
        for i in range(2):
            v = policy.velocity(unpack(xs[i], *x.shape[-2:]), sig[i], cond, guidance)
            torch.testing.assert_close(pack(v), vs[i], atol=1e-5, rtol=0)
    with torch.no_grad():      # the guidance matters (embedding on dev, CFG on klein)
        assert (policy.velocity(x, 0.5, cond, 1.0) - policy.velocity(x, 0.5, cond, 4.0)).abs().max() > 1e-4


def test_reference_image_velocity_matches_pipeline(policy):
    pil, img = _image()
    x = policy.noise(generators(2), H, W)
    sig, xs, vs = pipeline_step_velocities(policy.pipe, x, 2, **_kw(policy, guidance_scale=4.0, image=[pil]))
    cond = policy.encode(PROMPTS, images=[[img], [img]])
    assert cond.embeds["ref_tokens"].shape == (2, (R // 2) ** 2, 16)
    with torch.no_grad(), policy.adapter(None):
        for i in range(2):
            v = policy.velocity(unpack(xs[i], *x.shape[-2:]), sig[i], cond, 4.0)
            torch.testing.assert_close(pack(v), vs[i], atol=1e-5, rtol=0)
        plain = policy.velocity(x, 0.5, policy.encode(PROMPTS), 4.0)
        assert (policy.velocity(x, 0.5, cond, 4.0) - plain).abs().max() > 1e-4


def test_rows_with_different_references_equal_their_own_rows(policy):
    """One batch mixing no / one / two references (grouped by layout) equals each row run alone."""
    imgs = [_image(s)[1] for s in (1, 2)]
    cond = policy.encode(PROMPTS + PROMPTS[:1], images=[None, [imgs[0]], [imgs[1], imgs[0]]])
    assert cond.embeds["ref_hw"].tolist()[0] == [[0, 0], [0, 0]]
    x = policy.noise(generators(3), H, W)
    with torch.no_grad():
        v = policy.velocity(x, 0.7, cond, 4.0)
        for b in range(3):
            torch.testing.assert_close(v[b:b + 1], policy.velocity(x[b:b + 1], 0.7, cond.select([b]), 4.0),
                                       atol=1e-6, rtol=0)


def test_bad_reference_images_are_one_line_errors(policy):
    with pytest.raises(ValueError, match="one entry"):
        policy.encode(PROMPTS, images=[None])
    with pytest.raises(ValueError, match=r"\(3, H, W\)"):
        policy.encode(PROMPTS[:1], images=[[torch.zeros(1, 3, R, R)]])
    with pytest.raises(ValueError, match="multiples"):
        policy.encode(PROMPTS[:1], images=[[torch.zeros(3, 64, 62)]])


def test_ode_rollout_matches_pipeline_final_latents(policy):
    x = policy.noise(generators(2), H, W)
    policy.pipe.set_progress_bar_config(disable=True)
    with torch.no_grad(), policy.adapter(None):
        x0 = ode_sample(policy, x, policy.encode(PROMPTS), 3, 4.0)
        out = policy.pipe(latents=x.clone(), num_inference_steps=3, guidance_scale=4.0, output_type="latent",
                          **_kw(policy)).images
        img = policy.pipe(latents=x.clone(), num_inference_steps=3, guidance_scale=4.0, output_type="pt",
                          **_kw(policy)).images
    if policy.family == "flux2":      # dev returns the packed tokens
        torch.testing.assert_close(unpack(out, H // 2, W // 2), x0, atol=1e-5, rtol=0)
    else:                             # klein returns the denormalised, unpatchified VAE latents
        bn, eps = policy.vae.bn, policy.vae.config.batch_norm_eps
        z = x0 * torch.sqrt(bn.running_var.view(1, -1, 1, 1) + eps) + bn.running_mean.view(1, -1, 1, 1)
        torch.testing.assert_close(policy.pipe._unpatchify_latents(z), out, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(x0), img.float(), atol=1e-5, rtol=0)


def test_sde_log_probs_are_normal_on_flux2_latents(policy):
    x = policy.noise(generators(2), H, W)
    assert_sde_log_probs_are_normal(policy, x, policy.encode(PROMPTS), 0.8, 0.6, 4.0)


@pytest.mark.parametrize("steps,n", [(4, 4), (28, 32), (50, 64), (8, 72)])     # n × n tokens (72² > 4300)
def test_sigmas_equal_the_pipeline_recipe(policy, steps, n):
    """Flux2 step 5: linspace(1, 1/N, N), μ = compute_empirical_mu(h·w, N) (> 4300 tokens: the 200-step line)."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    latents = torch.zeros(1, 16, n, n)
    sched = FlowMatchEulerDiscreteScheduler.from_config(policy.scheduler_config)
    sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=compute_empirical_mu(n * n, steps))
    assert torch.equal(policy.sigmas(steps, latents), sched.sigmas)


def test_lora_reaches_both_block_kinds_and_shard_units_are_the_blocks(policy):
    names = {n for n, _ in policy.transformer.named_modules()}
    for target in ("transformer_blocks.0.attn.to_out.0.lora_A", "transformer_blocks.0.ff.linear_in.lora_A",
                   "single_transformer_blocks.0.attn.to_out.lora_A",
                   "single_transformer_blocks.0.attn.to_qkv_mlp_proj.lora_A"):
        assert any(n.startswith(target) for n in names), target
    (module, blocks), *_ = policy.shard_units()
    assert module is policy.transformer and [type(b).__name__ for b in blocks] == [
        "Flux2TransformerBlock", "Flux2SingleTransformerBlock"]


def test_distilled_klein_ignores_guidance_and_skips_the_negative_branch():
    from flowrl.policies.tiny_chat import flux2_components

    policy = Flux2KleinPolicy(flux2_components(0, klein=True), KleinConfig(max_sequence_length=SEQ),
                              is_distilled=True)
    cond = policy.encode(PROMPTS)
    x = policy.noise(generators(2), H, W)
    assert cond.uncond is None
    with torch.no_grad():
        assert torch.equal(policy.velocity(x, 0.5, cond, 1.0), policy.velocity(x, 0.5, cond, 4.0))


def test_save_load_round_trip(policy, tmp_path):
    with torch.no_grad():
        for p in policy.adapter_parameters("train"):
            p.add_(0.05 * torch.randn_like(p))
    out = policy.save_pretrained(tmp_path / "p")
    again = type(policy).from_pretrained(str(out), dtype=torch.float32)
    assert again.config == policy.config and again.pipe.__class__ is policy.pipe.__class__
    x = policy.noise(generators(2), H, W)
    with torch.no_grad():
        for name in ("train", "old", None):
            with policy.adapter(name), again.adapter(name):
                assert torch.equal(policy.velocity(x, 0.4, policy.encode(PROMPTS)),
                                   again.velocity(x, 0.4, again.encode(PROMPTS)))
    with torch.no_grad():
        for p in policy.adapter_parameters("train"):
            p.zero_()


def test_exported_lora_and_merged_transformer_in_the_stock_pipeline(policy, tmp_path):
    import diffusers

    from flowrl.policies.export import save_diffusers_lora, save_merged

    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in policy.adapter_parameters("train"):
            p.copy_(0.05 * torch.randn(p.shape, generator=g))
    base = policy.save_pretrained(tmp_path / "base")
    lora_file = save_diffusers_lora(policy, tmp_path / "lora")
    merged = save_merged(policy, tmp_path / "merged")
    pipe_cls = getattr(diffusers, policy.pipeline_class)
    with_lora = pipe_cls.from_pretrained(base)
    with_lora.load_lora_weights(lora_file.parent)
    fused = pipe_cls.from_pretrained(base, transformer=diffusers.Flux2Transformer2DModel.from_pretrained(merged))
    x, cond = policy.noise(generators(2), H, W), policy.encode(PROMPTS)
    for pipe in (with_lora, fused):
        sig, xs, vs = pipeline_step_velocities(pipe, x, 2, **_kw(policy, guidance_scale=4.0))
        with torch.no_grad(), policy.adapter("train"):
            for i in range(2):
                v = policy.velocity(unpack(xs[i], *x.shape[-2:]), sig[i], cond, 4.0)
                torch.testing.assert_close(pack(v), vs[i], atol=1e-5, rtol=0)
    with torch.no_grad(), policy.adapter(None):
        assert (pack(policy.velocity(x, sig[0], cond, 4.0)) - vs[0]).abs().max() > 1e-4
    with torch.no_grad():
        for p in policy.adapter_parameters("train"):
            p.zero_()
