"""Causal Wan: diffusers' ``WanTransformer3DModel`` made block-causal without forking its code.

Self-Forcing's ``CausalWanModel`` (``wan/modules/causal_model.py``), rebuilt on diffusers' classes:

* every block's ``attn1`` gets a ``CausalSelfAttention`` processor that either applies a boolean attention mask
  (full-sequence passes: block-causal training/replay, or none for bidirectional) or attends to
  ``KV cache ++ current chunk`` (chunk-by-chunk generation), writing K/V only when asked;
* a forward hook on ``transformer.rope`` shifts the temporal RoPE index by the chunk's absolute frame offset
  (Self-Forcing ``causal_rope_apply(..., start_frame)``), or uses explicit per-frame positions (replay);
* per-frame timesteps are passed as diffusers' 2-D per-token timestep (the "wan 2.2 ti2v" path), giving
  Self-Forcing's per-frame adaLN modulation.

The prediction is Wan's flow ``v = ε − x0`` in flowrl's convention ``x_σ = (1−σ)x0 + σε``, σ = t / 1000.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from flowrl.distill.kv_cache import (
    KVCache,
    _check_window,
    block_causal_frame_mask,
    expand_frame_mask,
    frame_blocks,
)


@dataclass
class AttentionState:
    """What the next forward does in self-attention; shared by all of one model's processors.

    mode: "bidirectional" | "mask" (use ``mask``) | "cache" (read ``cache``; write it when ``write``).
    frame_positions: (F,) absolute latent-frame index of each input frame, for RoPE.
    """

    mode: str = "bidirectional"
    mask: Tensor | None = None
    cache: KVCache | None = None
    write: bool = False
    frame_positions: Tensor | None = None
    read: KVCache | None = None   # frozen view of ``cache`` taken when the forward started

    def snapshot(self) -> AttentionState:
        """A copy that later cache writes cannot change (read side frozen; writes still reach ``cache``)."""
        return replace(self, read=None if self.cache is None else self.cache.view())


class RotaryWithState(tuple):
    """RoPE tables ``(cos, sin)`` that also carry the forward's ``AttentionState`` snapshot.

    diffusers passes the rope output into every block as an argument, so gradient checkpointing saves it and
    a recomputation in backward sees the attention mode and cache contents of the original forward."""

    def __new__(cls, cos: Tensor, sin: Tensor, state: AttentionState):
        obj = super().__new__(cls, (cos, sin))
        obj.attn_state = state
        return obj


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Wan's interleaved RoPE on (B, L, H, D): pairs (x₁, x₂) ↦ (x₁cos − x₂sin, x₁sin + x₂cos)."""
    x1, x2 = rearrange(x, "... (d pair) -> pair ... d", pair=2)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = rearrange(torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos]), "pair ... d -> ... (d pair)")
    return out.type_as(x)


class CausalSelfAttention:
    """Processor for ``WanAttention`` self-attention (attn1) honouring an ``AttentionState``."""

    def __init__(self, layer: int, state: AttentionState):
        self.layer, self.state = layer, state

    def __call__(self, attn, hidden_states: Tensor, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None) -> Tensor:
        def heads(t: Tensor) -> Tensor:
            return rearrange(t, "b l (h d) -> b l h d", h=attn.heads)

        q = heads(attn.norm_q(attn.to_q(hidden_states)))
        k = heads(attn.norm_k(attn.to_k(hidden_states)))
        v = heads(attn.to_v(hidden_states))
        if rotary_emb is not None:
            q, k = apply_rotary(q, *rotary_emb), apply_rotary(k, *rotary_emb)
        st, mask = getattr(rotary_emb, "attn_state", self.state), None
        if st.mode == "cache":
            k_all, v_all = (st.read or st.cache).extend(self.layer, k, v)
            if st.write:
                st.cache.store(self.layer, k, v)
            k, v = k_all, v_all
        elif st.mode == "mask":
            mask = st.mask.to(q.device)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask)
        out = rearrange(out, "b h l d -> b l (h d)").type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


def rope_with_positions(rope: nn.Module, shape: tuple[int, ...], positions: Tensor) -> tuple[Tensor, Tensor]:
    """Wan's 3-D RoPE tables (1, L, 1, D) with temporal index ``positions`` (F,) instead of 0..F−1."""
    h, w = shape[-2:]
    _, ph, pw = rope.patch_size
    hp, wp = h // ph, w // pw
    if int(positions.max()) >= rope.max_seq_len:
        raise ValueError(f"latent frame position {int(positions.max())} exceeds the RoPE table "
                         f"(rope_max_seq_len={rope.max_seq_len}); use a rolling window or a shorter stream")
    sizes = [rope.t_dim, rope.h_dim, rope.w_dim]
    n = positions.numel()
    out = []
    for table in (rope.freqs_cos, rope.freqs_sin):
        ft, fh, fw = table.split(sizes, dim=1)
        parts = [repeat(ft[positions.to(ft.device)], "f d -> f h w d", h=hp, w=wp),
                 repeat(fh[:hp], "h d -> f h w d", f=n, w=wp),
                 repeat(fw[:wp], "w d -> f h w d", f=n, h=hp)]
        out.append(rearrange(torch.cat(parts, dim=-1), "f h w d -> 1 (f h w) 1 d"))   # frame-major tokens
    return out[0], out[1]


class CausalWan(nn.Module):
    """A ``WanTransformer3DModel`` run block-causally (chunks of ``chunk_frames`` latent frames).

    Latents are (B, C, F, H, W); timesteps are on Wan's 0..1000 scale, either (B,) or per frame (B, F).
    """

    def __init__(self, transformer: nn.Module, chunk_frames: int = 3, window_frames: int | None = None,
                 sink_frames: int = 0):
        super().__init__()
        _check_window(window_frames, sink_frames, chunk_frames)
        self.transformer = transformer
        self.chunk_frames, self.window_frames, self.sink_frames = chunk_frames, window_frames, sink_frames
        self.state = AttentionState()
        for i, block in enumerate(transformer.blocks):
            block.attn1.set_processor(CausalSelfAttention(i, self.state))
        transformer.rope.register_forward_hook(self._rope_hook)

    @classmethod
    def from_pretrained(cls, path: str, subfolder: str | None = "transformer", torch_dtype=None, **kw) -> CausalWan:
        """Initialise the causal student from a bidirectional diffusers Wan checkpoint (e.g. Wan2.1-T2V-1.3B)."""
        from diffusers import WanTransformer3DModel

        tr = WanTransformer3DModel.from_pretrained(path, subfolder=subfolder, torch_dtype=torch_dtype)
        return cls(tr, **kw)

    @property
    def num_layers(self) -> int:
        return len(self.transformer.blocks)

    def tokens_per_frame(self, height: int, width: int) -> int:
        _, ph, pw = self.transformer.config.patch_size
        return (height // ph) * (width // pw)

    def new_cache(self, height: int, width: int) -> KVCache:
        """An empty cache for latents of spatial size (height, width)."""
        return KVCache(self.num_layers, self.tokens_per_frame(height, width), self.window_frames, self.sink_frames)

    def _rope_hook(self, module, args, output):
        pos = self.state.frame_positions
        if pos is not None:
            output = rope_with_positions(module, args[0].shape, pos)
        return RotaryWithState(output[0], output[1], self.state.snapshot())

    @contextmanager
    def _mode(self, **kw):
        old = dict(vars(self.state))
        for k, v in kw.items():
            setattr(self.state, k, v)
        try:
            yield
        finally:
            for k, v in old.items():
                setattr(self.state, k, v)

    def _call(self, x: Tensor, timestep: Tensor, text: Tensor) -> Tensor:
        """Run the transformer with (B,) or per-frame (B, F) timesteps."""
        t = torch.as_tensor(timestep, device=x.device, dtype=torch.float32)
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        if t.dim() == 2:
            if bool((t == t[:, :1]).all()):
                t = t[:, 0]
            else:
                t = t.repeat_interleave(self.tokens_per_frame(x.shape[-2], x.shape[-1]), dim=1)
        dtype = self.transformer.dtype
        out = self.transformer(hidden_states=x.to(dtype), timestep=t, encoder_hidden_states=text.to(dtype),
                               return_dict=False)[0]
        return out.float()

    def forward(self, x: Tensor, timestep: Tensor, text: Tensor, causal: bool = True,
                frame_positions: Tensor | None = None, frame_mask: Tensor | None = None) -> Tensor:
        """Full-sequence pass: block-causal mask (``causal``), an explicit (F, F) ``frame_mask``, or bidirectional."""
        f = x.shape[2]
        if frame_mask is None and causal:
            frame_mask = block_causal_frame_mask(frame_blocks(f, self.chunk_frames), self.window_frames,
                                                 self.sink_frames)
        if frame_mask is None:
            with self._mode(mode="bidirectional", frame_positions=frame_positions):
                return self._call(x, timestep, text)
        mask = expand_frame_mask(frame_mask, self.tokens_per_frame(x.shape[-2], x.shape[-1]))
        with self._mode(mode="mask", mask=mask, frame_positions=frame_positions):
            return self._call(x, timestep, text)

    def chunk(self, x: Tensor, timestep: Tensor, text: Tensor, cache: KVCache, write: bool = False) -> Tensor:
        """One chunk (B, C, f, H, W) attending to ``cache``; with ``write`` its K/V are stored (detached) and
        the cache advances. Writes are refused under autograd: only a no-grad pass may fill the cache."""
        if write and torch.is_grad_enabled():
            raise RuntimeError("KV-cache writes must run under torch.no_grad() (the clean-context pass); "
                               "wrap the t=0 cache update in `with torch.no_grad():`")
        f = x.shape[2]
        pos = torch.arange(cache.next_frame, cache.next_frame + f)
        with self._mode(mode="cache", cache=cache, write=write, frame_positions=pos):
            out = self._call(x, timestep, text)
        if write:
            cache.commit(f)
        return out


def x0_from_flow(x: Tensor, v: Tensor, sigma: Tensor) -> Tensor:
    """x̂0 = x − σ·v (Self-Forcing ``_convert_flow_pred_to_x0``); σ broadcast from (B,) or (B, F)."""
    return x - _bcast(sigma, x) * v


def flow_from_x0(x: Tensor, x0: Tensor, sigma: Tensor) -> Tensor:
    """v̂ = (x − x̂0)/σ (``_convert_x0_to_flow_pred``)."""
    return (x - x0) / _bcast(sigma, x)


def _bcast(sigma: Tensor, x: Tensor) -> Tensor:
    sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device)
    if sigma.dim() == 0:
        return sigma
    if sigma.dim() == 1:
        return sigma.view(-1, *([1] * (x.dim() - 1)))
    return sigma.view(sigma.shape[0], 1, sigma.shape[1], 1, 1)  # (B, F) per-frame
