"""LTX2Policy against diffusers' LTX2Pipeline on the tiny preset (same components, generators): joint video + audio
velocity with every guidance term, σ grid, ODE rollout, decode, LoRA export, save/load, the published size."""
import json
from pathlib import Path

import pytest
import torch

from flowrl.eval.sample import ode_sample
from flowrl.policies.ltx2 import Config, LTX2Policy
from tests.policies.conftest import assert_sde_log_probs_are_normal, generators, perturb, scheduler_step_calls

PROMPTS = ["dance monkey", "a cat walking on the beach"]
H = W = 32
F = 5
KW = {"height": H, "width": W, "num_frames": F, "max_sequence_length": 16, "frame_rate": 24.0}
OFF = {"guidance_scale": 1.0, "audio_guidance_scale": 1.0, "stg_scale": 0.0, "audio_stg_scale": 0.0,
       "modality_scale": 1.0, "audio_modality_scale": 1.0, "guidance_rescale": 0.0, "audio_guidance_rescale": 0.0}
# every term on, block 1 of the two tiny blocks for STG (pipeline defaults otherwise: w 3, audio 7, rescale 0.7)
ON = {"guidance_scale": 3.0, "audio_guidance_scale": 7.0, "stg_scale": 1.0, "audio_stg_scale": 1.0,
      "modality_scale": 3.0, "audio_modality_scale": 3.0, "guidance_rescale": 0.7, "audio_guidance_rescale": 0.7,
      "spatio_temporal_guidance_blocks": [1]}
CONFIG_ON = Config(max_sequence_length=16, stg_blocks=(1,))
CONFIG_OFF = Config(max_sequence_length=16, audio_guidance=None, stg_scale=0.0, audio_stg_scale=None,
                    modality_scale=1.0, audio_modality_scale=None, guidance_rescale=0.0, audio_guidance_rescale=None)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from diffusers import LTX2Pipeline

    policy = LTX2Policy.tiny(config=CONFIG_ON)
    perturb(policy, "train", 0.05, 1)
    path = policy.save_pretrained(tmp_path_factory.mktemp("ltx2"))
    pipe = LTX2Pipeline.from_pretrained(path)
    pipe.set_progress_bar_config(disable=True)
    return policy, path, pipe


def _record(pipe, steps, **kw):
    """Run the pipeline; (σ grid, [(video x, audio x, video v, audio v)] per step, unpacked) from both schedulers'
    ``step`` (the class method is wrapped: the audio scheduler is a deepcopy made inside ``__call__``; calls
    alternate video, audio)."""
    calls, out = scheduler_step_calls(pipe, steps, **kw)
    f, h, w = (F - 1) // 2 + 1, H // 2, W // 2
    rows = []
    for i in range(steps):
        (xv, vv), (xa, va) = calls[2 * i], calls[2 * i + 1]
        un_v = [pipe._unpack_latents(t, f, h, w, 1, 1) for t in (xv, vv)]
        un_a = [pipe._unpack_audio_latents(t, xa.shape[1], num_mel_bins=2) for t in (xa, va)]
        rows.append((un_v[0], un_a[0], un_v[1], un_a[1]))
    return pipe.scheduler.sigmas.float(), rows, out


@pytest.mark.parametrize("guided", [True, False])
def test_step_matches_the_pipeline_video_and_audio(saved, guided):
    policy, _, pipe = saved
    policy.config = CONFIG_ON if guided else CONFIG_OFF
    try:
        sig, rows, _ = _record(pipe, 3, prompt=PROMPTS, generator=generators(2), **KW, **(ON if guided else OFF))
        x = policy.noise(generators(2), H, W, F)
        assert torch.equal(policy.join(rows[0][0], rows[0][1]), x)            # the pipeline's own draws
        assert torch.equal(policy.sigmas(3, x), sig)
        cond = policy.encode(PROMPTS, cfg=guided)
        with torch.no_grad(), policy.adapter(None):
            for i, (xv, xa, vv, va) in enumerate(rows):
                v = policy.velocity(policy.join(xv, xa), sig[i], cond, 3.0 if guided else 1.0)
                got_v, got_a = policy.split(v)
                torch.testing.assert_close(got_v, vv, atol=1e-5, rtol=0)
                torch.testing.assert_close(got_a, va, atol=1e-5, rtol=0)
    finally:
        policy.config = CONFIG_ON


def test_lora_export_rollout_and_decode_match_the_pipeline(saved, tmp_path):
    from diffusers import LTX2Pipeline

    from flowrl.policies.export import save_diffusers_lora

    policy, path, _ = saved
    file = save_diffusers_lora(policy, tmp_path)
    pipe = LTX2Pipeline.from_pretrained(path)
    pipe.load_lora_weights(file.parent)
    pipe.set_progress_bar_config(disable=True)
    x = policy.noise(generators(2), H, W, F)
    cond = policy.encode(PROMPTS)
    with torch.no_grad():
        ours = ode_sample(policy, x, cond, 3, 3.0)
        theirs = pipe(prompt=PROMPTS, generator=generators(2), num_inference_steps=3, output_type="latent",
                      **KW, **ON)
        video, audio = policy.split(ours)
        vae, avae = pipe.vae, pipe.audio_vae
        torch.testing.assert_close(pipe._denormalize_latents(video, vae.latents_mean, vae.latents_std,
                                                             vae.config.scaling_factor), theirs.frames,
                                   atol=1e-5, rtol=0)
        packed = pipe._denormalize_audio_latents(pipe._pack_audio_latents(audio), avae.latents_mean,
                                                 avae.latents_std)
        torch.testing.assert_close(pipe._unpack_audio_latents(packed, audio.shape[2], num_mel_bins=2),
                                   theirs.audio, atol=1e-5, rtol=0)
        out = pipe(prompt=PROMPTS, generator=generators(2), num_inference_steps=3, output_type="pt", **KW, **ON)
        torch.testing.assert_close(policy.decode(ours), out.frames.float(), atol=1e-5, rtol=0)
        torch.testing.assert_close(policy.decode_audio(ours), out.audio.float(), atol=1e-5, rtol=0)
        assert policy.decode(ours).shape == (2, F, 3, H, W)
        with policy.adapter(None):
            assert (ode_sample(policy, x, cond, 3, 3.0) - ours).abs().max() > 1e-4


def test_save_load_round_trip_shard_units_and_sde_log_prob(saved):
    policy, path, _ = saved
    again = LTX2Policy.from_pretrained(str(path), dtype=torch.float32)
    assert (again.family, again.config) == ("ltx2", policy.config)
    x = policy.noise(generators(2), H, W, F)
    again.latent_shape(H, W, F)
    cond, cond2 = policy.encode(PROMPTS), again.encode(PROMPTS)
    with torch.no_grad():
        for name in ("train", "old", None):
            with policy.adapter(name), again.adapter(name):
                assert torch.equal(policy.velocity(x, 0.6, cond), again.velocity(x, 0.6, cond2))
    units = policy.shard_units()
    assert [type(b).__name__ for b in units[0][1]] == ["LTX2VideoTransformerBlock"] * 2
    names = {n.split(".lora_")[0].split(".", 2)[-1] for n in policy.adapter_state_dict("train")}
    assert len({n.split(".", 1)[1] if n[0].isdigit() else n for n in names}) == 28      # Flow-Factory's 28 Linears
    assert_sde_log_probs_are_normal(policy, x, cond, 0.8, 0.6, 3.0)
    with pytest.raises(ValueError, match="images: 1 entries for 2 prompts"):     # first frames: test_ltx2_i2v.py
        policy.encode(PROMPTS, images=[[torch.rand(3, H, W)]])


def test_full_fine_tune_and_frames_rule():
    full = LTX2Policy.tiny(config=Config(lora=None, max_sequence_length=16, stg_blocks=(1,)))
    assert len(full.trainable_parameters()) == len(list(full.transformer.parameters()))
    assert len(full.shard_units()) == 3
    with pytest.raises(ValueError, match="num_frames"):
        LTX2Policy.check_resolution(512, 768, 120)
    LTX2Policy.check_resolution(512, 768, 121)


def test_published_transformer_size_on_meta():
    """configs/gpu/ltx2_transformer.json (Lightricks/LTX-2 transformer/config.json) built on the meta device."""
    from accelerate import init_empty_weights
    from diffusers import LTX2VideoTransformer3DModel

    cfg = json.loads((Path(__file__).parents[2] / "configs/gpu/ltx2_transformer.json").read_text())
    with init_empty_weights():
        model = LTX2VideoTransformer3DModel.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert len(model.transformer_blocks) == 48
    assert round(n / 1e9) == 19, n                      # "LTX-2 … 19B" (model card); printed exactly in the docs
