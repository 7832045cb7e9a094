"""Stream-R1 weights, RMD chunk scoring and replay, ODE init, streaming decode, checkpoint loading."""
import math

import pytest
import torch

from flowrl.distill import rmd, stream_r1
from flowrl.distill.causal_wan import CausalWan
from flowrl.distill.components import decode_video, tiny_vae, tiny_wan
from flowrl.distill.dmd import DMDConfig, generator_dmd_loss
from flowrl.distill.ode_init import Config as ODEConfig
from flowrl.distill.ode_init import ode_regression_loss, teacher_sigmas, teacher_trajectory
from flowrl.distill.rollout import self_forcing_rollout
from flowrl.distill.schedule import denoising_timesteps
from flowrl.distill.streaming import StreamingDecoder, stream_video


# ------------------------------------------------------------------ Stream-R1
def test_intra_weights_closed_form():
    s = torch.zeros(1, 2, 2, 2)
    s[0, 0] = torch.tensor([[0.0, 1.0], [1.0, 2.0]])   # frame 0: mean 1.0 → temporal minmax 1
    s[0, 1] = torch.tensor([[0.0, 0.0], [0.0, 0.4]])   # frame 1: mean 0.1 → temporal minmax 0
    w = stream_r1.intra_weights(s, tau_min=0.2, sigma_min=0.15)[0, 0]
    w_t = torch.tensor([1.0, 0.2]) / 0.6
    ws0 = torch.tensor([[0.15, 0.5], [0.5, 1.0]])
    ws0 = ws0 / ws0.mean()
    ws1 = torch.tensor([[0.15, 0.15], [0.15, 1.0]])
    ws1 = ws1 / ws1.mean()
    ref = torch.stack([w_t[0] * ws0, w_t[1] * ws1])
    assert torch.allclose(w, ref / ref.mean(), atol=1e-6)
    assert math.isclose(float(w.mean()), 1.0, rel_tol=1e-6)


def test_fuse_saliency_softmax_of_negative_reward():
    g = torch.zeros(2, 1, 1, 3, 2, 2)
    g[0, ..., 0, 0, 0] = 3.0       # axis 0: gradient (3, 4, 0) at pixel (0, 0) → norm 5
    g[0, ..., 1, 0, 0] = 4.0
    g[1, ..., 0, 1, 1] = 2.0       # axis 1: norm 2 at pixel (1, 1)
    r = torch.tensor([[0.0, math.log(2.0)]])
    s = stream_r1.fuse_saliency(g, r, tau=1.0, latent_fhw=(1, 2, 2))
    w0, w1 = 2 / 3, 1 / 3          # softmax(−r) = (1, 1/2)/1.5: the lower reward weighs more
    assert torch.allclose(s[0, 0], torch.tensor([[5 * w0, 0.0], [0.0, 2 * w1]]), atol=1e-6)


def test_axis_balance_and_rollout_weight():
    bal = stream_r1.AxisBalance(2, window=4, lam=0.5)
    for v in ([0.0, 0.0], [0.0, 0.0], [1.0, 0.0]):
        out = bal(torch.tensor([v]))
        assert torch.allclose(out, torch.tensor(v).mean()[None])          # warm-up: plain mean
    out = bal(torch.tensor([[1.0, 0.0]]))
    d = torch.tensor([1.0, 0.0])                                          # Δ per axis: recent − early half
    assert torch.allclose(out, torch.tensor([0.5 - 0.5 * d.std()]))
    assert torch.allclose(stream_r1.rollout_weight(torch.tensor([0.5]), 2.0), torch.tensor([math.e]))


def test_score_axes_pixel_gradient_and_weighted_dmd_gradient():
    px = torch.rand(2, 3, 3, 2, 2)
    raw, grads = stream_r1.score_axes([lambda b: b.pixels.mean(dim=(1, 2, 3, 4))], px, ["a", "b"], True)
    assert torch.allclose(raw[:, 0], px.mean(dim=(1, 2, 3, 4)))
    assert torch.allclose(grads, torch.full_like(grads, 1 / px[0].numel()))
    x = torch.randn(2, 2, 3, 2, 2, requires_grad=True)
    w = stream_r1.rollout_weight(raw[:, 0], 2.0).view(-1, 1, 1, 1, 1) * torch.rand(2, 1, 3, 2, 2)

    def score(xt, t, c):
        return xt * 0.1

    loss, sc = generator_dmd_loss(x, None, None, score, lambda xt, t, c: xt * 0.3, DMDConfig(), w)
    loss.backward()
    assert torch.allclose(x.grad, (w * sc.grad / x.numel()), atol=1e-7)  # exp(βr)·W_intra ⊙ g / N


# ------------------------------------------------------------------ RMD
def test_split_merge_and_combination():
    x = torch.randn(2, 3, 4, 2, 2)
    xs = rmd.split_chunks(x, 1)
    assert xs.shape == (8, 3, 1, 2, 2) and torch.equal(xs[5], x[1, :, 1:2])
    assert torch.equal(rmd.merge_chunks(xs, 2), x)
    with pytest.raises(ValueError, match="score_chunk_frames"):
        rmd.split_chunks(x, 3)
    got = rmd.combine_first_chunk(torch.tensor(3.0), torch.tensor(1.0), 1, 20, 2.0)
    assert torch.isclose(got, torch.tensor((2 * 1 * 3.0 + 20 * 1.0) / 22))


def test_chunk_scores_see_one_chunk_alone():
    seen = []

    def teacher(xt, t, c):
        seen.append(xt.shape[2])
        return xt * 0.5
    x = torch.randn(1, 2, 4, 2, 2)
    xs = rmd.split_chunks(x, 1)
    _, sa = generator_dmd_loss(xs, None, None, teacher, lambda xt, t, c: xt * 0.2, DMDConfig(),
                                    generator=torch.Generator().manual_seed(0))
    assert set(seen) == {1}
    x2 = x.clone()
    x2[:, :, 3] += 5.0                        # changing chunk 3 leaves chunks 0..2's DMD gradient unchanged
    _, sb = generator_dmd_loss(rmd.split_chunks(x2, 1), None, None, teacher, lambda xt, t, c: xt * 0.2,
                               DMDConfig(), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(sa.grad[:3], sb.grad[:3]) and not torch.allclose(sa.grad[3], sb.grad[3])


def test_replay_forward_equals_rollout_and_has_grad(student, video_inputs):
    x, text = video_inputs
    ts = denoising_timesteps("self_forcing")
    with torch.no_grad():
        ro = self_forcing_rollout(student, x, text, ts, same_exit_across_chunks=False,
                                  generator=torch.Generator().manual_seed(4))
    rep = rmd.replay_forward(student, ro, text)
    assert (rep - ro.video).abs().max() < 1e-5
    assert rep.requires_grad


# ------------------------------------------------------------------ ODE init
def test_teacher_trajectory_and_regression():
    noise = torch.randn(1, 2, 4, 2, 2)
    c = torch.randn(1, 2, 4, 2, 2)
    lat, ts = teacher_trajectory(lambda x, t, txt: c, noise, None, None, ODEConfig(teacher_steps=8),
                                 torch.tensor([1000.0, 500.0]))
    sig = teacher_sigmas(8, 8.0)
    assert torch.allclose(lat[-1], noise - c, atol=1e-6)            # ∫ dσ over [1, 0] of constant v = −c
    k = int((sig - 0.5).abs().argmin())
    assert torch.allclose(lat[1], noise - (1 - float(sig[k])) * c, atol=1e-6) and ts[-1] == 0
    model = CausalWan(tiny_wan(0), chunk_frames=2)
    lat = torch.randn(3, 1, 16, 4, 2, 2)
    loss = ode_regression_loss(model, lat, torch.tensor([1000.0, 600.0, 0.0]), torch.randn(1, 8, 32))
    loss.backward()
    assert torch.isfinite(loss) and model.transformer.proj_out.weight.grad is not None


# ------------------------------------------------------------------ streaming and loading
def test_streaming_decoder_equals_full_decode(student, video_inputs):
    x, text = video_inputs
    vae = tiny_vae(0)
    with torch.no_grad():
        full = decode_video(vae, x[:1])
        dec = StreamingDecoder(vae)
        parts = [dec.decode(x[:1, :, s:s + 2]) for s in (0, 2, 4)]
        chunks = list(stream_video(student, dec, x[:1], text[:1], denoising_timesteps("causvid")))
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)
    assert [c.frames.shape[1] for c in chunks] == [p.shape[1] for p in parts]
    assert all(b.latency_seconds >= a.latency_seconds for a, b in zip(chunks, chunks[1:]))


def test_student_initialised_from_bidirectional_checkpoint(tmp_path, video_inputs):
    from flowrl.distill.config import ModelConfig
    from flowrl.distill.roles import build_roles

    tiny_wan(3).save_pretrained(tmp_path / "transformer")
    roles = build_roles(ModelConfig(tiny=False, teacher=str(tmp_path), chunk_frames=2))
    ref = CausalWan(tiny_wan(3), chunk_frames=2)
    x, text = video_inputs
    t = torch.full((2, 6), 500.0)
    with torch.no_grad():
        assert torch.allclose(roles.student(x, t, text), ref(x, t, text), atol=1e-6)
    assert not any(p.requires_grad for p in roles.teacher.parameters())
    assert all(p.requires_grad for p in roles.critic.parameters())
    with pytest.raises(ValueError, match="model.teacher"):
        build_roles(ModelConfig(tiny=False))


def test_load_original_self_forcing_checkpoint(tmp_path, video_inputs):
    """An original-key-format generator checkpoint (as Self-Forcing saves it) loads into the diffusers student."""
    from flowrl.distill.components import original_wan_state_dict

    src = tiny_wan(5)
    to_original = [("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
                   ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
                   ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
                   ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
                   ("condition_embedder.time_proj", "time_projection.1"), ("attn1", "self_attn"),
                   ("attn2", "cross_attn"), (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."),
                   (".to_v.", ".v."), ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"), ("norm2", "norm3"),
                   ("proj_out", "head.head")]
    orig = {}
    for k, v in src.state_dict().items():
        k = "head.modulation" if k == "scale_shift_table" else k.replace("scale_shift_table", "modulation")
        for a, b in to_original:
            k = k.replace(a, b)
        orig["model." + k] = v
    torch.save({"generator": {}, "generator_ema": orig}, tmp_path / "sf.pt")
    model = CausalWan(tiny_wan(0), chunk_frames=2)
    model.transformer.load_state_dict(original_wan_state_dict(str(tmp_path / "sf.pt")))
    x, text = video_inputs
    t = torch.full((2, 6), 300.0)
    with torch.no_grad():
        assert torch.allclose(model(x, t, text), CausalWan(src, chunk_frames=2)(x, t, text), atol=1e-6)
    with pytest.raises(KeyError, match="generator_x"):
        original_wan_state_dict(str(tmp_path / "sf.pt"), key="generator_x")


def test_rmd_stage_two_settings():
    cfg = rmd.Config(chunk_stage_iterations=10, video_lr_generator=2e-6, video_critic_steps_per_generator=5)
    assert rmd.stage_settings(9, cfg, 2e-5, 2e-5, 6) == (2e-5, 2e-5, 6)
    assert rmd.stage_settings(10, cfg, 2e-5, 2e-5, 6) == (2e-6, 2e-5, 5)


def test_rmd_first_chunk_goes_to_base_teacher_and_its_own_critic():
    from types import SimpleNamespace

    from flowrl.distill.objectives import Batch, rmd_chunk_loss
    from flowrl.distill.roles import Roles, bidirectional_score

    class Fake:
        def __init__(self, scale):
            self.transformer, self.scale, self.batches = SimpleNamespace(dtype=torch.float32), scale, []

        def __call__(self, x, t, text, causal=True):
            self.batches.append(x.shape[0])
            return x * self.scale

    roles = Roles(None, Fake(0.5), Fake(0.2), None, None, chunk_teacher=Fake(0.7), first_critic=Fake(0.1))
    rcfg = rmd.Config(first_chunk_weight=2.0)
    x = torch.randn(2, 3, 4, 2, 2, requires_grad=True)
    batch = Batch(["a", "b"], torch.zeros(2, 1, 1), torch.zeros(2, 1, 1))
    loss, _ = rmd_chunk_loss(x, roles, batch, rcfg, DMDConfig(), torch.Generator().manual_seed(0))
    assert roles.teacher.batches == [2, 2] and roles.first_critic.batches == [2]      # cond + uncond, 2 videos
    assert roles.chunk_teacher.batches == [6, 6] and roles.critic.batches == [6]      # 3 later chunks × 2
    dcfg = DMDConfig(guidance_scale=1.0)
    gen = torch.Generator().manual_seed(0)
    xs = rmd.split_chunks(x.detach(), 1)
    z = torch.zeros(2, 1, 1)
    l1, _ = generator_dmd_loss(xs[[0, 4]], z, z, bidirectional_score(Fake(0.5)), bidirectional_score(Fake(0.1)),
                               dcfg, generator=gen)
    lr, _ = generator_dmd_loss(xs[[1, 2, 3, 5, 6, 7]], torch.zeros(6, 1, 1), torch.zeros(6, 1, 1),
                               bidirectional_score(Fake(0.7)), bidirectional_score(Fake(0.2)), dcfg, generator=gen)
    assert torch.allclose(loss, (2 * l1 + 3 * lr) / (3 + 2)) and loss.requires_grad


def test_rmd_chunk_split_is_sample_major_and_merge_inverts_it():
    from flowrl.distill.rmd import merge_chunks, split_chunks

    x = torch.randn(2, 3, 6, 2, 2)
    parts = split_chunks(x, 2)                        # row b·n + k is frames 2k..2k+1 of sample b
    assert parts.shape == (6, 3, 2, 2, 2)
    for b in range(2):
        for k in range(3):
            assert torch.equal(parts[b * 3 + k], x[b, :, 2 * k:2 * k + 2])
    assert torch.equal(merge_chunks(parts, 2), x)
    with pytest.raises(ValueError, match="score_chunk_frames"):
        split_chunks(x, 4)
