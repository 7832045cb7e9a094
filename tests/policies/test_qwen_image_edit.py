"""QwenImageEditPolicy against diffusers' QwenImageEditPipeline on the tiny preset, with a source image.

The pipeline resizes every source to 1024² pixels (``calculate_dimensions(1024 * 1024, ratio)``, no argument to
change it): at that size one tiny step takes seconds on CPU. The tests patch the pipeline module's
``calculate_dimensions`` to a 32² area and build the policy with ``reference_area=32 * 32`` — the same rule at a
smaller area — and give 32×32 sources, so neither side resizes.
"""
import numpy as np
import pytest
import torch

from flowrl.policies.flux import pack_latents, unpack_latents
from flowrl.policies.qwen_image_edit import Config, QwenImageEditPolicy, reference_size
from tests.policies.conftest import generators, pipeline_step_velocities

PROMPTS = ["make the circle blue", "add a cat"]
NEG = ["blurry", " "]
H = W = 16
LH = LW = H // 4
AREA = 32 * 32


def _sources(n=2, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    pil = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]
    tensors = [torch.from_numpy(np.asarray(p).copy()).permute(2, 0, 1).float() / 255 for p in pil]
    return pil, tensors


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    policy = QwenImageEditPolicy.tiny(seed=0, config=Config(max_sequence_length=64, reference_area=AREA))
    return policy, policy.save_pretrained(tmp_path_factory.mktemp("qwen_image_edit"))


@pytest.fixture(scope="module")
def pipe(saved):
    from diffusers import QwenImageEditPipeline

    pipe = QwenImageEditPipeline.from_pretrained(saved[1])
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def small_reference(monkeypatch):
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as mod

    original = mod.calculate_dimensions
    monkeypatch.setattr(mod, "calculate_dimensions", lambda area, ratio: original(AREA, ratio))


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_velocity_with_source_image_matches_pipeline(saved, pipe, small_reference, guidance):
    policy, _ = saved
    pil, src = _sources()
    x = policy.noise(generators(2), H, W)
    neg = NEG if guidance > 1 else None
    sig, xs, vs = pipeline_step_velocities(pipe, pack_latents(x), 2, image=pil, prompt=PROMPTS, negative_prompt=neg,
                                           true_cfg_scale=guidance, height=H, width=W)
    assert torch.equal(policy.sigmas(2, x), sig)
    cond = policy.encode(PROMPTS, negative_prompts=neg, cfg=guidance > 1, images=[[s] for s in src])
    assert cond.embeds["image_latents"].shape == (2, (32 // 8) ** 2, 16)
    with torch.no_grad(), policy.adapter(None):
        for i in range(2):
            v = policy.velocity(unpack_latents(xs[i], LH, LW), sig[i], cond, guidance)
            torch.testing.assert_close(v, unpack_latents(vs[i], LH, LW), atol=1e-5, rtol=0)


def test_ode_rollout_through_the_engine_matches_pipeline(saved, pipe, small_reference):
    from samplers.engine import SampleSpec, SamplingEngine

    policy, _ = saved
    pil, src = _sources(seed=3)
    engine = SamplingEngine(policy, SampleSpec(steps=3, height=H, width=W, guidance=4.0, negative_prompt="blurry",
                                               adapter=None, chunk=1))
    out = engine.sample(PROMPTS, generators(2, seed=7), images=[[s] for s in src])
    final = pipe(image=pil, prompt=PROMPTS, negative_prompt=["blurry"] * 2, true_cfg_scale=4.0, height=H, width=W,
                 num_inference_steps=3, latents=pack_latents(policy.noise(generators(2, seed=7), H, W)),
                 output_type="latent").images
    torch.testing.assert_close(out.result.latents, unpack_latents(final, LH, LW), atol=1e-5, rtol=0)
    assert out.cond.select([1]).embeds["image_latents"].shape[0] == 1


def test_source_image_changes_the_velocity_and_is_required(saved):
    policy, _ = saved
    _, (a, b) = _sources()
    x = policy.noise(generators(1), H, W)
    with torch.no_grad():
        va = policy.velocity(x, 0.5, policy.encode(PROMPTS[:1], cfg=False, images=[[a]]))
        vb = policy.velocity(x, 0.5, policy.encode(PROMPTS[:1], cfg=False, images=[[b]]))
    assert (va - vb).abs().max() > 1e-4
    with pytest.raises(ValueError, match="one source image per prompt"):
        policy.encode(PROMPTS, images=[[a], None])
    with pytest.raises(ValueError, match=r"float tensor \(3, H, W\)"):
        policy.encode(PROMPTS[:1], images=[[a[0]]])
    with pytest.raises(ValueError, match="different sizes"):
        policy.encode(PROMPTS, images=[[a], [torch.rand(3, 32, 96)]])


def test_default_configs_are_the_family_ones():
    from flowrl.policies.qwen_image_edit import PlusConfig, QwenImageEditPlusPolicy
    from flowrl.policies.tiny_qwen import qwen_image_components

    assert QwenImageEditPolicy(qwen_image_components(0, edit=True)).config.reference_area == 1024 * 1024
    plus = QwenImageEditPlusPolicy(qwen_image_components(0, edit=True))        # config=None: the family's
    assert isinstance(plus.config, PlusConfig) and plus.config.condition_area == 384 * 384


def test_exported_lora_loaded_by_the_edit_pipeline_matches_the_policy(saved, small_reference, tmp_path):
    from diffusers import QwenImageEditPipeline

    from flowrl.policies.export import save_diffusers_lora

    policy, path = saved
    before = policy.adapter_state_dict("train")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.adapter_parameters("train"):
            p.copy_(0.05 * torch.randn(p.shape, generator=g))
    try:
        pipe = QwenImageEditPipeline.from_pretrained(path)
        pipe.load_lora_weights(save_diffusers_lora(policy, tmp_path / "lora").parent)
        pipe.set_progress_bar_config(disable=True)
        pil, src = _sources()
        x = policy.noise(generators(2), H, W)
        sig, xs, vs = pipeline_step_velocities(pipe, pack_latents(x), 2, image=pil, prompt=PROMPTS,
                                               negative_prompt=NEG, true_cfg_scale=4.0, height=H, width=W)
        cond = policy.encode(PROMPTS, negative_prompts=NEG, images=[[s] for s in src])
        x1 = unpack_latents(xs[1], LH, LW)
        with torch.no_grad(), policy.adapter("train"):
            v = policy.velocity(x1, sig[1], cond, 4.0)
        torch.testing.assert_close(v, unpack_latents(vs[1], LH, LW), atol=1e-5, rtol=0)
        with torch.no_grad(), policy.adapter(None):
            assert (policy.velocity(x1, sig[1], cond, 4.0) - v).abs().max() > 1e-4      # the adapter matters
    finally:
        policy.load_adapter_state_dict(before, "train")


def test_reference_size_is_the_pipeline_rule():
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

    for h, w in [(1024, 1024), (768, 1360), (500, 333)]:
        cw, ch, _ = calculate_dimensions(1024 * 1024, w / h)
        assert reference_size(1024 * 1024, h, w) == (ch, cw)


def test_save_load_round_trip_and_flag(saved):
    policy, path = saved
    assert policy.accepts_images and policy.family == "qwen_image_edit"
    again = QwenImageEditPolicy.from_pretrained(str(path), dtype=torch.float32)
    assert again.config.reference_area == AREA
    _, src = _sources()
    x = policy.noise(generators(2), H, W)
    cond = policy.encode(PROMPTS, images=[[s] for s in src])
    with torch.no_grad():
        assert torch.equal(policy.velocity(x, 0.4, cond), again.velocity(x, 0.4, again.encode(
            PROMPTS, images=[[s] for s in src])))


# ------------------------------------------------------------------------------------ Edit-Plus: several sources

@pytest.fixture(scope="module")
def plus(saved):
    from diffusers import QwenImageEditPlusPipeline

    from flowrl.policies.qwen_image_edit import PlusConfig, QwenImageEditPlusPolicy

    policy = QwenImageEditPlusPolicy.from_pretrained(str(saved[1]), dtype=torch.float32,
                                                     config=PlusConfig(reference_area=AREA, condition_area=AREA))
    pipe = QwenImageEditPlusPipeline(**{k: v for k, v in policy.pipe.components.items()})
    pipe.set_progress_bar_config(disable=True)
    return policy, pipe


@pytest.fixture
def small_plus_sizes(monkeypatch):
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as mod

    monkeypatch.setattr(mod, "VAE_IMAGE_SIZE", AREA)
    monkeypatch.setattr(mod, "CONDITION_IMAGE_SIZE", AREA)


def test_edit_plus_two_sources_match_the_pipeline_step_and_rows_are_batch_independent(plus, small_plus_sizes):
    policy, pipe = plus
    pil, src = _sources(2, seed=4)
    x = policy.noise(generators(1), H, W)
    sig, xs, vs = pipeline_step_velocities(pipe, pack_latents(x), 2, image=pil, prompt=PROMPTS[:1],
                                           negative_prompt=["blurry"], true_cfg_scale=4.0, height=H, width=W)
    cond = policy.encode(PROMPTS[:1], negative_prompts=["blurry"], images=[src])
    assert cond.embeds["image_grid"].tolist() == [[[4, 4], [4, 4]]]          # 32 px / 4 (VAE) / 2 (packing)
    with torch.no_grad(), policy.adapter(None):
        for i in range(2):
            v = policy.velocity(unpack_latents(xs[i], LH, LW), sig[i], cond, 4.0)
            torch.testing.assert_close(v, unpack_latents(vs[i], LH, LW), atol=1e-5, rtol=0)
        one = policy.encode(PROMPTS[:1], cfg=False, images=[src[:1]])
        assert (policy.velocity(x, 0.5, one) - policy.velocity(x, 0.5, policy.encode(
            PROMPTS[:1], cfg=False, images=[src]))).abs().max() > 1e-4          # the second source matters
    two_rows = policy.encode(PROMPTS, cfg=False, images=[src, src[::-1]])
    with torch.no_grad():
        v = policy.velocity(policy.noise(generators(2), H, W), 0.5, two_rows)
        v0 = policy.velocity(policy.noise(generators(1), H, W), 0.5, two_rows.select([0]))
    torch.testing.assert_close(v[:1], v0, atol=1e-6, rtol=0)                  # a row is independent of its batch
