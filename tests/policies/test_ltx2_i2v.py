"""LTX-2 image-to-video (flowrl/policies/ltx2_image.py) against diffusers' LTX2ImageToVideoPipeline on the tiny preset
(same components, generators, first frames): each step's video and audio velocity, the ODE rollout's final latents,
rows without an image = text-to-video rows, and the H.264 re-compression wired as the pipeline's."""
import numpy as np
import pytest
import torch

from flowrl.eval.sample import ode_sample
from flowrl.policies.ltx2 import Config, LTX2Policy
from flowrl.policies.ltx2_image import first_frame_latents, i2v_pipe
from tests.policies.conftest import assert_sde_log_probs_are_normal, generators, scheduler_step_calls

PROMPTS = ["a red ball rolls to the left", "a cat walking on the beach"]
H = W = 32
F = 5
LATENT = ((F - 1) // 2 + 1, H // 2, W // 2)             # the tiny VAE: ×2 in time and space
KW = {"height": H, "width": W, "num_frames": F, "max_sequence_length": 16, "frame_rate": 24.0, "image_crf": 0}
ON = {"guidance_scale": 3.0, "audio_guidance_scale": 7.0, "stg_scale": 1.0, "audio_stg_scale": 1.0,
      "modality_scale": 3.0, "audio_modality_scale": 3.0, "guidance_rescale": 0.7, "audio_guidance_rescale": 0.7,
      "spatio_temporal_guidance_blocks": [1]}
OFF = {"guidance_scale": 1.0, "audio_guidance_scale": 1.0, "stg_scale": 0.0, "audio_stg_scale": 0.0,
       "modality_scale": 1.0, "audio_modality_scale": 1.0, "guidance_rescale": 0.0, "audio_guidance_rescale": 0.0}
CONFIG_ON = Config(max_sequence_length=16, stg_blocks=(1,), image_crf=0)
CONFIG_OFF = Config(max_sequence_length=16, audio_guidance=None, stg_scale=0.0, audio_stg_scale=None,
                    modality_scale=1.0, audio_modality_scale=None, guidance_rescale=0.0, audio_guidance_rescale=None,
                    image_crf=0)


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(3)
    policy = LTX2Policy.tiny(config=CONFIG_ON)
    pipe = i2v_pipe(policy)
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(7)
    images = (torch.rand(2, 3, H, W, generator=g) * 255).round() / 255          # exact uint8 values
    return policy, pipe, images


def _record(pipe, steps, **kw):
    """Run the pipeline; per step (video frames 1: x, audio x (packed), video frames 1: v, audio v) from both
    schedulers' ``step`` (calls alternate video, audio) and the output."""
    calls, out = scheduler_step_calls(pipe, steps, **kw)
    return [(*calls[2 * i], *calls[2 * i + 1]) for i in range(steps)], out


def _to_flowrl(pipe, out):
    """The pipeline's (denormalised) output latents → flowrl's normalised video (B, C, F', H', W') and audio."""
    vae, avae = pipe.vae, pipe.audio_vae
    v = pipe._normalize_latents(out.frames.float(), vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    a = pipe._normalize_audio_latents(pipe._pack_audio_latents(out.audio.float()), avae.latents_mean,
                                      avae.latents_std)
    return v, pipe._unpack_audio_latents(a, out.audio.shape[2], num_mel_bins=out.audio.shape[3])


@pytest.mark.parametrize("guided", [True, False])
def test_step_matches_the_i2v_pipeline_video_and_audio(setup, guided):
    policy, pipe, images = setup
    policy.config = CONFIG_ON if guided else CONFIG_OFF
    try:
        with torch.no_grad(), policy.adapter(None):
            rows, _ = _record(pipe, 3, image=images, prompt=PROMPTS, generator=generators(2), **KW,
                              **(ON if guided else OFF))
            x = policy.noise(generators(2), H, W, F)
            sig = policy.sigmas(3, x)
            cond = policy.encode(PROMPTS, cfg=guided, images=[[img] for img in images])
            c = first_frame_latents(policy, policy.split(x)[0], cond)
            video0 = policy.split(x)[0]
            assert torch.equal(rows[0][0], video0[:, :, 1:])                    # the pipeline's own draws
            for i, (xv, vv, xa, va) in enumerate(rows):
                audio = pipe._unpack_audio_latents(xa, xa.shape[1], num_mel_bins=2)
                state = policy.join(torch.cat([c, xv], dim=2), audio)         # frame 0 = c, as the pipeline's
                got_v, got_a = policy.split(policy.velocity(state, sig[i], cond, 3.0 if guided else 1.0))
                torch.testing.assert_close(got_v[:, :, 1:], vv, atol=1e-5, rtol=0)
                assert got_v[:, :, :1].abs().max() < 1e-6                       # (x − c)/σ = 0 on the clean frame
                torch.testing.assert_close(pipe._pack_audio_latents(got_a), va, atol=1e-5, rtol=0)
    finally:
        policy.config = CONFIG_ON


@pytest.mark.parametrize("steps", [2, 4])
def test_ode_rollout_ends_at_the_i2v_pipelines_latents(setup, steps):
    """flowrl starts frame 0 from noise and drives it to c with v = (x − c)/σ; frames 1: see the pipeline's inputs
    (x_in) at every step, so the final latents equal the pipeline's, the clean frame included."""
    policy, pipe, images = setup
    with torch.no_grad(), policy.adapter(None):
        out = pipe(image=images, prompt=PROMPTS, generator=generators(2), num_inference_steps=steps,
                   output_type="latent", **KW, **ON)
        cond = policy.encode(PROMPTS, images=[[img] for img in images])
        final = ode_sample(policy, policy.noise(generators(2), H, W, F), cond, steps, 3.0)
    video, audio = policy.split(final)
    want_v, want_a = _to_flowrl(pipe, out)
    torch.testing.assert_close(video, want_v, atol=1e-5, rtol=0)
    torch.testing.assert_close(audio, want_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(video[:, :, :1], cond.embeds["image_latents"], atol=1e-5, rtol=0)


def test_a_row_without_image_is_a_text_to_video_row(setup):
    policy, _, images = setup
    x = policy.noise(generators(2), H, W, F)
    with torch.no_grad(), policy.adapter(None):
        mixed = policy.velocity(x, 0.7, policy.encode(PROMPTS, images=[[images[0]], None]), 3.0)
        t2v = policy.velocity(x, 0.7, policy.encode(PROMPTS), 3.0)
        i2v = policy.velocity(x, 0.7, policy.encode(PROMPTS, images=[[images[0]], [images[1]]]), 3.0)
    torch.testing.assert_close(mixed[1], t2v[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[0], i2v[0], atol=1e-5, rtol=0)
    assert (mixed[0] - t2v[0]).abs().max() > 1e-3                            # the image changes row 0
    assert_sde_log_probs_are_normal(policy, x, policy.encode(PROMPTS, images=[[images[0]], None]), 0.8, 0.6, 3.0)
    with pytest.raises(ValueError, match="one size"):
        policy.encode(PROMPTS, images=[[images[0]], [torch.rand(3, 2 * H, W)]])


def test_recompression_is_the_pipelines(setup, monkeypatch):
    """image_crf None → the checkpoint's default (33 for Gemma 3) through ``apply_image_conditioning_crf`` on the
    uint8 image, as the pipeline's PIL path (PyAV is not installed here: the codec is swapped for a known map)."""
    from diffusers.pipelines.ltx2 import pipeline_ltx2_image2video as module
    from PIL import Image

    policy, pipe, images = setup
    seen = []

    def codec(img, crf):
        seen.append(crf)
        return ((255 - img.astype(np.int32)) // 2 + 40).astype(np.uint8)    # a known, lossy map of the image

    monkeypatch.setattr(module, "apply_image_conditioning_crf", codec)
    policy.config = Config(max_sequence_length=16, stg_blocks=(1,), image_crf=None)
    try:
        u8 = (images[0] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        with torch.no_grad(), policy.adapter(None):
            out = pipe(image=Image.fromarray(u8), prompt=PROMPTS[:1], generator=generators(1),
                       num_inference_steps=2, output_type="latent", **{**KW, "image_crf": None}, **OFF)
            cond = policy.encode(PROMPTS[:1], images=[[images[0]]])
            c = first_frame_latents(policy, policy.split(policy.noise(generators(1), H, W, F))[0], cond)
        torch.testing.assert_close(c, _to_flowrl(pipe, out)[0][:, :, :1], atol=1e-5, rtol=0)
        assert seen == [33, 33]
        assert c.shape[2:] == (1, *LATENT[1:])
    finally:
        policy.config = CONFIG_ON


def test_h264_first_frame_round_trip_matches_the_pipelines(setup):
    """With PyAV installed (the dev extra): a real H.264 re-compression at CRF 33 (the Gemma 3 checkpoints'
    default) on the pipeline's PIL path and on flowrl's tensors gives the same latents after a 2-step rollout,
    and the codec changes the first frame (it is not skipped). The pipeline re-compresses one PIL image only."""
    pytest.importorskip("av")
    from PIL import Image

    policy, pipe, images = setup
    prompt, image = PROMPTS[:1], images[:1]
    pil = Image.fromarray((image[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))
    policy.config = Config(max_sequence_length=16, stg_blocks=(1,), image_crf=33)
    try:
        with torch.no_grad(), policy.adapter(None):
            out = pipe(image=pil, prompt=prompt, generator=generators(1), num_inference_steps=2,
                       output_type="latent", **{**KW, "image_crf": 33}, **ON)
            cond = policy.encode(prompt, images=[[image[0]]])
            final = ode_sample(policy, policy.noise(generators(1), H, W, F), cond, 2, 3.0)
            coded = first_frame_latents(policy, policy.split(final)[0], cond)
    finally:
        policy.config = CONFIG_ON
    video, audio = policy.split(final)
    want_v, want_a = _to_flowrl(pipe, out)
    torch.testing.assert_close(video, want_v, atol=1e-5, rtol=0)
    torch.testing.assert_close(audio, want_a, atol=1e-5, rtol=0)
    with torch.no_grad():
        plain = first_frame_latents(policy, video, policy.encode(prompt, images=[[image[0]]]))
    assert (coded - plain).abs().max() > 1e-4                                # CRF 33 moved the first frame
