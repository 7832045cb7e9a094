"""Per-layer self-attention K/V cache for chunk-by-chunk causal generation, and the equivalent attention mask.

Self-Forcing's protocol (``causal_model.py``): after a chunk's last denoising step its clean output is re-run at
t = 0 and only that pass writes K/V (after RoPE) into the cache; every denoising pass reads the cache and
attends to ``cache ++ current chunk``. Entries are stored detached, so the cache never carries gradient.

Rolling window with attention sink (``window_frames``/``sink_frames``, Self-Forcing ``local_attn_size`` /
``sink_size``): a query chunk whose last frame is E−1 attends to frames ``[0, sink) ∪ [E − (window − sink), E)``.
``block_causal_mask`` builds exactly that set for a single full-sequence pass, so the two paths agree.
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor


def _check_window(window_frames: int | None, sink_frames: int, chunk_frames: int) -> None:
    if sink_frames < 0:
        raise ValueError(f"sink_frames must be >= 0, got {sink_frames}")
    if window_frames is not None and window_frames < sink_frames + chunk_frames:
        raise ValueError(f"window_frames={window_frames} must be >= sink_frames ({sink_frames}) + chunk_frames "
                         f"({chunk_frames}) so a chunk still sees itself; raise window_frames or lower sink_frames")


def frame_blocks(num_frames: int, chunk_frames: int) -> Tensor:
    """Block index of each latent frame: ``⌊f / chunk_frames⌋`` (Self-Forcing ``num_frame_per_block``)."""
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
    return torch.arange(num_frames) // chunk_frames


def block_causal_frame_mask(blocks: Tensor, window_frames: int | None = None, sink_frames: int = 0) -> Tensor:
    """(F, F) bool, True where query frame i may attend key frame j.

    attend(i, j) = block(j) ≤ block(i)  [∧ (j < sink ∨ j ≥ end(i) − (window − sink))]
    with end(i) = one past the last frame of i's block (Self-Forcing ``_prepare_blockwise_causal_attn_mask``).
    ``blocks`` is a non-decreasing (F,) tensor of block ids (first block may be longer).
    """
    f = blocks.shape[0]
    idx = torch.arange(f)
    ends = torch.tensor([int((blocks <= blocks[i]).sum()) for i in range(f)])
    allow = blocks[None, :] <= blocks[:, None]
    if window_frames is not None:
        in_window = idx[None, :] >= (ends[:, None] - (window_frames - sink_frames))
        allow = allow & (in_window | (idx[None, :] < sink_frames))
    return allow


def expand_frame_mask(frame_mask: Tensor, tokens_per_frame: int) -> Tensor:
    """Token-level (L, L) bool mask from a frame-level one; tokens are frame-major (Wan's patch order)."""
    return frame_mask.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)


class KVCache:
    """Self-attention K/V of already generated (clean) frames, one entry per transformer layer.

    k, v per layer: (B, L_cached, heads, head_dim), detached. ``next_frame`` is the absolute latent-frame index
    of the next chunk (its RoPE offset); it keeps counting when old frames are evicted.
    """

    def __init__(self, num_layers: int, tokens_per_frame: int, window_frames: int | None = None,
                 sink_frames: int = 0):
        self.num_layers = num_layers
        self.tokens_per_frame = tokens_per_frame
        self.window_frames = window_frames
        self.sink_frames = sink_frames
        self.k: list[Tensor | None] = [None] * num_layers
        self.v: list[Tensor | None] = [None] * num_layers
        self.next_frame = 0
        self._frame_ids: Tensor = torch.empty(0, dtype=torch.long)  # absolute frame of each cached frame slot

    @property
    def cached_frames(self) -> int:
        return int(self._frame_ids.numel())

    def _selected_frames(self, new_frames: int) -> Tensor:
        """Positions (into the stored frames) visible to a chunk of ``new_frames`` frames."""
        ids = self._frame_ids
        if self.window_frames is None:
            return torch.arange(ids.numel())
        _check_window(self.window_frames, self.sink_frames, new_frames)
        end = self.next_frame + new_frames
        keep = (ids < self.sink_frames) | (ids >= end - (self.window_frames - self.sink_frames))
        return keep.nonzero().flatten()

    def _token_index(self, frame_pos: Tensor) -> Tensor:
        t = self.tokens_per_frame
        return (frame_pos[:, None] * t + torch.arange(t)[None, :]).flatten()

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys/values a new chunk attends to: the visible cached frames followed by the chunk's own."""
        ck, cv = self.k[layer], self.v[layer]
        if ck is None:
            return k, v
        if self.window_frames is None:  # global attention: every cached frame is visible
            return torch.cat([ck, k], dim=1), torch.cat([cv, v], dim=1)
        new_frames = k.shape[1] // self.tokens_per_frame
        tok = self._token_index(self._selected_frames(new_frames)).to(ck.device)
        return torch.cat([ck[:, tok], k], dim=1), torch.cat([cv[:, tok], v], dim=1)

    def store(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Append a chunk's K/V (detached) for ``layer``; ``commit`` afterwards advances the frame counter."""
        k, v = k.detach(), v.detach()
        self.k[layer] = k if self.k[layer] is None else torch.cat([self.k[layer], k], dim=1)
        self.v[layer] = v if self.v[layer] is None else torch.cat([self.v[layer], v], dim=1)

    def commit(self, new_frames: int) -> None:
        """Advance after a cache-writing pass over ``new_frames`` frames; evict frames outside the window."""
        new_ids = torch.arange(self.next_frame, self.next_frame + new_frames)
        self._frame_ids = torch.cat([self._frame_ids, new_ids])
        self.next_frame += new_frames
        if self.window_frames is None:
            return
        ids = self._frame_ids
        keep = ((ids < self.sink_frames) | (ids >= self.next_frame - (self.window_frames - self.sink_frames)))
        if bool(keep.all()):
            return
        pos = keep.nonzero().flatten()
        tok = self._token_index(pos)
        for i in range(self.num_layers):
            if self.k[i] is not None:
                self.k[i] = self.k[i][:, tok.to(self.k[i].device)]
                self.v[i] = self.v[i][:, tok.to(self.v[i].device)]
        self._frame_ids = ids[pos]

    def view(self) -> KVCache:
        """A read-only snapshot sharing tensors (``store`` rebinds, never mutates, so later writes do not show)."""
        snap = copy.copy(self)
        snap.k, snap.v = list(self.k), list(self.v)
        return snap

    def tensors(self) -> list[Tensor]:
        return [t for t in self.k + self.v if t is not None]
