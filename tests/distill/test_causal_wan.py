"""Causal Wan: KV-cached chunk passes ≡ one block-causal masked pass; the cache never carries gradient."""
import pytest
import torch

from flowrl.distill.causal_wan import CausalWan, rope_with_positions
from flowrl.distill.components import tiny_wan
from flowrl.distill.kv_cache import block_causal_frame_mask, frame_blocks
from flowrl.distill.rollout import self_forcing_rollout
from flowrl.distill.schedule import denoising_timesteps

T = torch.tensor([[700.0, 700, 400, 400, 100, 100]] * 2)


def chunked(model, x, t, text):
    cache = model.new_cache(x.shape[-2], x.shape[-1])
    outs = []
    with torch.no_grad():
        for s in range(0, x.shape[2], model.chunk_frames):
            sl = slice(s, s + model.chunk_frames)
            outs.append(model.chunk(x[:, :, sl], t[:, sl], text, cache, write=True))
    return torch.cat(outs, dim=2), cache


def test_bidirectional_processor_matches_stock_diffusers(video_inputs):
    x, text = video_inputs
    model, stock = CausalWan(tiny_wan(0), chunk_frames=2), tiny_wan(0)
    with torch.no_grad():
        ours = model(x, T, text, causal=False)
        ref = stock(hidden_states=x, timestep=T.repeat_interleave(4, 1), encoder_hidden_states=text,
                    return_dict=False)[0]
    assert torch.allclose(ours, ref, atol=1e-6)


@pytest.mark.parametrize("window,sink", [(None, 0), (4, 1), (4, 0)])
def test_kv_cached_chunks_equal_block_causal_pass(video_inputs, window, sink):
    x, text = video_inputs
    model = CausalWan(tiny_wan(0), chunk_frames=2, window_frames=window, sink_frames=sink)
    with torch.no_grad():
        full = model(x, T, text)
        bidir = model(x, T, text, causal=False)
    got, cache = chunked(model, x, T, text)
    assert (got - full).abs().max() < 1e-5
    assert (full - bidir).abs().max() > 1e-2          # the mask matters
    if window is not None:
        assert cache.cached_frames <= window          # rolling eviction keeps the cache bounded


def test_causality_future_frames_do_not_change_past(video_inputs, student):
    x, text = video_inputs
    x2 = x.clone()
    x2[:, :, 4:] += 1.0
    with torch.no_grad():
        a, b = student(x, T, text), student(x2, T, text)
    assert torch.allclose(a[:, :, :4], b[:, :, :4], atol=1e-6)
    assert not torch.allclose(a[:, :, 4:], b[:, :, 4:], atol=1e-3)


def test_frame_mask_with_window_and_sink():
    m = block_causal_frame_mask(frame_blocks(6, 2), window_frames=4, sink_frames=1)
    # query frame 5 (block 2, end 6): sees sink frame 0 and frames >= 6 - 3 = 3
    assert m[5].tolist() == [True, False, False, True, True, True]
    assert m[1].tolist() == [True, True, False, False, False, False]


def test_rope_offset_equals_slice_of_longer_table(student):
    rope = student.transformer.rope
    full_cos, full_sin = rope(torch.zeros(1, 16, 6, 4, 4))
    cos, sin = rope_with_positions(rope, (1, 16, 2, 4, 4), torch.arange(2, 4))
    assert torch.equal(cos, full_cos[:, 8:16]) and torch.equal(sin, full_sin[:, 8:16])
    with pytest.raises(ValueError, match="rope_max_seq_len"):
        rope_with_positions(rope, (1, 16, 1, 4, 4), torch.tensor([32]))


def test_cache_never_carries_gradient(video_inputs, student):
    x, text = video_inputs
    cache = student.new_cache(4, 4)
    with pytest.raises(RuntimeError, match="no_grad"):
        student.chunk(x[:, :, :2], T[:, :2], text, cache, write=True)
    ts = denoising_timesteps("self_forcing")
    out = self_forcing_rollout(student, x, text, ts, generator=torch.Generator().manual_seed(1))
    assert out.video.requires_grad
    out.video.sum().backward()
    assert student.transformer.proj_out.weight.grad is not None


def test_rollout_exit_output_equals_masked_pass_over_clean_context(video_inputs, student):
    """The rollout's chunk k (exit step) ≡ a full block-causal pass over [clean chunks < k (t=0) | exit input]."""
    x, text = video_inputs
    ts = denoising_timesteps("self_forcing")
    with torch.no_grad():
        out = self_forcing_rollout(student, x, text, ts, grad=False, generator=torch.Generator().manual_seed(3))
        k = 2
        inp = torch.cat([out.video[:, :, :2 * k], out.replay_inputs[k]], dim=2)
        tk = torch.tensor([0.0] * (2 * k) + [out.replay_timesteps[k]] * 2).expand(2, -1)
        v = student(inp, tk, text)[:, :, 2 * k:]
        x0 = out.replay_inputs[k] - out.replay_timesteps[k] / 1000 * v
    assert (x0 - out.video[:, :, 2 * k:]).abs().max() < 1e-5


def test_gradient_checkpointing_recomputes_with_the_original_attention_state(video_inputs):
    """Backward recomputation must see the cache/mask of the original forward, not the state at backward time."""
    x, text = video_inputs
    ts = denoising_timesteps("self_forcing")
    grads = []
    for ckpt in (False, True):
        model = CausalWan(tiny_wan(0), chunk_frames=2)
        if ckpt:
            model.transformer.enable_gradient_checkpointing()
        model.train()
        out = self_forcing_rollout(model, x, text, ts, exit_generator=torch.Generator().manual_seed(0),
                                   generator=torch.Generator().manual_seed(1))
        masked = model(x, T, text)                     # a block-causal masked pass in the same graph
        (out.video.square().mean() + masked.square().mean()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
