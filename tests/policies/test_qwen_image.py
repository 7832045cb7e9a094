"""QwenImagePolicy against diffusers' QwenImagePipeline on the tiny preset (same components, same latents)."""
import pytest
import torch

from flowrl.policies.flux import pack_latents, unpack_latents
from flowrl.policies.qwen_image import Config, QwenImagePolicy, rescaled_cfg, trim_text
from tests.policies.conftest import generators, pipeline_step_velocities

PROMPTS = ["a red circle left of a blue square", "a photo of a cat"]
NEG = ["blurry", " "]
H = W = 16
LH = LW = H // 4          # tiny VAE factor 4


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    policy = QwenImagePolicy.tiny(seed=0, config=Config(max_sequence_length=32))
    return policy, policy.save_pretrained(tmp_path_factory.mktemp("qwen_image"))


@pytest.fixture(scope="module")
def pipe(saved):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(saved[1])
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_velocity_matches_pipeline(saved, pipe, guidance):
    policy, _ = saved
    x = policy.noise(generators(2), H, W)
    neg = NEG if guidance > 1 else None
    sig, xs, vs = pipeline_step_velocities(pipe, pack_latents(x), 2, prompt=PROMPTS, negative_prompt=neg,
                                           true_cfg_scale=guidance, height=H, width=W, max_sequence_length=32)
    assert torch.equal(policy.sigmas(2, x), sig)
    cond = policy.encode(PROMPTS, negative_prompts=neg, cfg=guidance > 1)
    with torch.no_grad(), policy.adapter(None):
        for i in range(2):
            v = policy.velocity(unpack_latents(xs[i], LH, LW), sig[i], cond, guidance)
            torch.testing.assert_close(v, unpack_latents(vs[i], LH, LW), atol=1e-5, rtol=0)


def test_ode_rollout_matches_pipeline_latents(saved, pipe):
    from samplers.engine import SampleSpec, SamplingEngine

    policy, _ = saved
    engine = SamplingEngine(policy, SampleSpec(steps=3, height=H, width=W, guidance=4.0, negative_prompt="blurry",
                                               adapter=None))
    gens = generators(2, seed=5)
    out = engine.sample(PROMPTS, gens)
    final = pipe(prompt=PROMPTS, negative_prompt=["blurry"] * 2, true_cfg_scale=4.0, height=H, width=W,
                 num_inference_steps=3, latents=pack_latents(policy.noise(generators(2, seed=5), H, W)),
                 max_sequence_length=32, output_type="latent").images
    torch.testing.assert_close(out.result.latents, unpack_latents(final, LH, LW), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kernel", ["flow_sde", "dance_sde", "cps"])
def test_sde_log_probs_are_normal_log_probs_on_qwen_latents(saved, kernel):
    from samplers import KERNELS
    from samplers.engine import SampleSpec, SamplingEngine
    from samplers.windows import StepPlan

    policy, _ = saved
    k = KERNELS.get(kernel)
    cfg = k.config(log_prob="gaussian") if kernel == "cps" else k.config()
    engine = SamplingEngine(policy, SampleSpec(steps=3, height=H, width=W, guidance=4.0, kernel=kernel,
                                               kernel_cfg=cfg, store=True, adapter="old"))
    traj = engine.sample(PROMPTS, generators(2), StepPlan(3, sde_steps=(0, 1))).result.traj
    assert traj.x.shape == (2, 2, 4, H // 4, W // 4)
    ref = torch.distributions.Normal(traj.mean, traj.std[..., None, None, None]).log_prob(traj.x_next)
    torch.testing.assert_close(traj.log_prob, ref.mean((2, 3, 4)), atol=1e-4, rtol=1e-5)


def test_decode_matches_pipeline(saved, pipe):
    policy, _ = saved
    x = policy.noise(generators(1), H, W)
    kw = {"prompt": PROMPTS[:1], "num_inference_steps": 2, "height": H, "width": W, "max_sequence_length": 32}
    img = pipe(latents=pack_latents(x), output_type="pt", **kw).images
    final = pipe(latents=pack_latents(x), output_type="latent", **kw).images
    torch.testing.assert_close(policy.decode(unpack_latents(final, LH, LW)), img.float(), atol=1e-5, rtol=0)


def test_rows_padded_across_chunks_keep_their_velocity(saved):
    """A short prompt padded beside a long one (cat_conds) gives the velocity it has when encoded alone."""
    from samplers.engine import cat_conds

    policy, _ = saved
    short, long = policy.encode(["a cat"], cfg=False), policy.encode(["a big red dog next to a blue house"], cfg=False)
    both = cat_conds([short, long])
    assert both.embeds["prompt_embeds"].shape[1] == long.embeds["prompt_embeds"].shape[1]
    x = policy.noise(generators(2), H, W)
    with torch.no_grad():
        v = policy.velocity(x, 0.7, both)
        torch.testing.assert_close(v[:1], policy.velocity(x[:1], 0.7, short), atol=1e-6, rtol=0)
    emb, mask = trim_text(both.embeds["prompt_embeds"][:1], both.embeds["prompt_embeds_mask"][:1])
    assert mask is None and emb.shape == short.embeds["prompt_embeds"].shape


def test_rescaled_cfg_keeps_the_conditional_norm():
    g = torch.Generator().manual_seed(0)
    vc, vn = torch.randn(2, 5, 64, generator=g), torch.randn(2, 5, 64, generator=g)
    out = rescaled_cfg(vc, vn, 4.0)
    torch.testing.assert_close(out.norm(dim=-1), vc.norm(dim=-1))
    cos = torch.nn.functional.cosine_similarity(out, vn + 4.0 * (vc - vn), dim=-1)
    torch.testing.assert_close(cos, torch.ones_like(cos))


def test_images_are_refused_with_one_line_error(saved):
    policy, _ = saved
    img = torch.rand(3, 16, 16)
    with pytest.raises(ValueError, match="does not accept images"):
        policy.encode(PROMPTS, images=[[img], None])
    assert policy.encode(PROMPTS, images=[None, None], cfg=False).embeds["prompt_embeds"].shape[0] == 2


def test_save_load_round_trip(saved):
    policy, path = saved
    with torch.no_grad():
        for p in policy.adapter_parameters("train"):
            p.add_(0.05 * torch.randn_like(p))
    out = policy.save_pretrained(path)
    again = QwenImagePolicy.from_pretrained(str(out), dtype=torch.float32)
    assert (again.config.lora.rank, again.config.max_sequence_length) == (64, 32)
    x, cond = policy.noise(generators(2), H, W), policy.encode(PROMPTS)
    with torch.no_grad():
        for name in ("train", "old", None):
            with policy.adapter(name), again.adapter(name):
                assert torch.equal(policy.velocity(x, 0.4, cond), again.velocity(x, 0.4, again.encode(PROMPTS)))


def test_contract_defaults_and_shard_units(saved):
    from flowrl.policies.base import Policy

    policy, _ = saved
    assert isinstance(policy, Policy) and policy.accepts_images is False
    assert (policy.family, policy.default_guidance) == ("qwen_image", 4.0)
    units = policy.shard_units()
    assert [type(b).__name__ for b in units[0][1]] == ["QwenImageTransformerBlock"] * 2
    targets = {n.rsplit(".", 1)[0] for n in policy.adapter_state_dict("train")}
    assert {"transformer_blocks.0.img_mlp.net.2", "transformer_blocks.1.attn.to_add_out"} <= {
        t.rsplit(".", 1)[0] for t in targets}
    with pytest.raises(ValueError, match="multiples of 8"):
        policy.latent_shape(12, 16)


def test_full_fine_tune_trains_every_weight_and_keeps_frozen_copies():
    from flowrl.policies.ema import EMA

    policy = QwenImagePolicy.tiny(seed=1, config=Config(max_sequence_length=32, lora=None))
    params = policy.trainable_parameters()
    assert sum(p.numel() for p in params) == sum(p.numel() for p in policy.transformer.parameters())
    assert len(policy.shard_units()) == 3                     # trained, "old" and the base copy
    ema = EMA(params, decay=0.9, update_interval=1)
    x, cond = policy.noise(generators(1), H, W), policy.encode(PROMPTS[:1], cfg=False)
    with torch.no_grad():
        for p in params:
            p.add_(0.05 * torch.randn_like(p))
        ema.update(1)
        v_train = policy.velocity(x, 0.5, cond)
        with policy.adapter("old"):
            v_old = policy.velocity(x, 0.5, cond)
        with policy.adapter(None):
            torch.testing.assert_close(policy.velocity(x, 0.5, cond), v_old)   # both frozen at the start
        assert (v_old - v_train).abs().max() > 1e-4
        ema.store()
        ema.copy_to()                                        # 0.18·start + 0.82·trained (warm-up β_1 = 2/11)
        v_ema = policy.velocity(x, 0.5, cond)
        ema.restore()
        assert (v_ema - v_train).abs().max() > 1e-6 and (v_ema - v_old).abs().max() > 1e-6
        assert torch.equal(policy.velocity(x, 0.5, cond), v_train)
