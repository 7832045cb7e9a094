"""Procedural renderer of the moving-shapes world: prompt metadata → a random clip that satisfies it → pixels,
deterministic from a seed (numpy only; shapes drawn with the image world's ``shape_mask``).

Motion is piecewise linear: an object's box corner moves v px per frame along its direction's axis
(p_f = round(p_0 + sign·v·f) within a moving phase), v = ``speed_px`` of slow / normal / fast (1 / 2 / 3 px per
frame at 8 frames of 32 px; travel scales with the frame side). Timelines per skill, with k drawn from
[⌈(F−1)/3⌉, ⌊2(F−1)/3⌋]:

    motion    moves all clip, speed slow | normal | fast at random     speed   moves all clip at the named speed
    bounce    fast towards the wall, reaches it at frame k, comes back  pair    both move all clip, normal speed
    order     first moves (fast) for frames 0..k, second for k..F−1     appear  first moves all clip (normal);
    sequence  three still objects entering at frames 0 < k₂ < k₃                the second enters, still, at k

Objects stay inside the frame and their boxes never touch (≥ 1 px gap in every frame; rejection sampling).
"""
from __future__ import annotations

import math

import numpy as np

from flowrl.data.shapes.render import shape_mask
from flowrl.data.video_shapes.world import (
    BACKGROUND,
    FRAMES,
    IMAGE_SIZE,
    PALETTE,
    SHADE_JITTER,
    SIZES,
    MovingShape,
    axis_sign,
    speed_px,
)

MAX_TRIES = 200


def _mid_frame(rng: np.random.Generator, frames: int) -> int:
    lo, hi = math.ceil((frames - 1) / 3), (frames - 1) * 2 // 3
    return int(rng.integers(lo, hi + 1))


def _timelines(meta: dict, rng: np.random.Generator, frames: int, size: int
               ) -> list[tuple[int, np.ndarray, str | None]]:
    """Per object: (first frame, signed per-step speed (F−1,) along its axis, direction)."""
    skill, objs = meta["skill"], meta["objects"]
    steps = frames - 1
    out = []
    if skill in ("motion", "speed", "pair"):
        for o in objs:
            name = o["speed"] or (["slow", "normal", "fast"][rng.integers(3)] if skill == "motion" else "normal")
            out.append((0, np.full(steps, speed_px(name, frames, size)), o["direction"]))
    elif skill == "bounce":
        k, v = _mid_frame(rng, frames), speed_px("fast", frames, size)
        out.append((0, np.where(np.arange(steps) < k, v, -v), objs[0]["direction"]))
    elif skill == "order":
        k, v = _mid_frame(rng, frames), speed_px("fast", frames, size)
        first = np.arange(steps) < k
        out += [(0, np.where(first, v, 0.0), objs[0]["direction"]), (0, np.where(first, 0.0, v), objs[1]["direction"])]
    elif skill == "appear":
        out += [(0, np.full(steps, speed_px("normal", frames, size)), objs[0]["direction"]),
                (_mid_frame(rng, frames), np.zeros(steps), None)]
    elif skill == "sequence":
        k2 = int(rng.integers(1, max(2, frames // 2)))
        k3 = int(rng.integers(k2 + 1, frames))
        out += [(k, np.zeros(steps), None) for k in (0, k2, k3)]
    else:
        raise ValueError(f"unknown moving-shapes skill {skill!r}")
    return out


def _corners(first: int, speeds: np.ndarray, direction: str | None, box: int, size: int,
             rng: np.random.Generator, bounce: bool) -> tuple[tuple[int, int] | None, ...]:
    """Box corners (y, x) per frame for one timeline, placed at random inside the frame."""
    limit = size - box
    offs = np.concatenate([[0.0], np.cumsum(speeds)])           # travel along the motion (≥ 0 before a bounce)
    if direction is None:
        y, x = int(rng.integers(limit + 1)), int(rng.integers(limit + 1))
        return tuple(None if f < first else (y, x) for f in range(len(offs)))
    axis, sign = axis_sign(direction)
    lo, hi = offs.min(), offs.max()
    if hi - lo > limit:
        raise ValueError(f"a {hi - lo:.0f}-px path does not fit a {size}-px frame; use fewer frames or a larger size")
    if bounce:     # the turning point touches the wall
        start = limit - hi if sign > 0 else hi
    else:
        start = float(rng.uniform(-lo, limit - hi)) if sign > 0 else float(rng.uniform(hi, limit + lo))
    along = np.rint(start + sign * offs).astype(int)
    across = int(rng.integers(limit + 1))
    pts = [(across, int(a)) if axis == 0 else (int(a), across) for a in along]
    return tuple(None if f < first else p for f, p in enumerate(pts))


def _clear(a: MovingShape, b: MovingShape) -> bool:
    """True when the two boxes keep ≥ 1 px of gap in every frame both are in."""
    for pa, pb in zip(a.corners, b.corners):
        if pa is None or pb is None:
            continue
        if pa[0] <= pb[0] + b.size and pb[0] <= pa[0] + a.size and pa[1] <= pb[1] + b.size and pb[1] <= pa[1] + a.size:
            return False
    return True


def sample_clip(meta: dict, rng: np.random.Generator, frames: int = FRAMES, size: int = IMAGE_SIZE
                ) -> list[MovingShape]:
    """A random clip (objects with per-frame corners) that satisfies metadata ``meta`` (see grammar.py)."""
    if frames < 4 or size < 16:
        raise ValueError(f"moving-shapes clips need ≥ 4 frames of ≥ 16 px, got frames={frames}, size={size}")
    for _ in range(MAX_TRIES):
        clip = []
        for o, (first, speeds, direction) in zip(meta["objects"], _timelines(meta, rng, frames, size)):
            box = int(SIZES[rng.integers(len(SIZES))])
            shade = tuple(float(v) for v in rng.uniform(-SHADE_JITTER, SHADE_JITTER, size=3))
            corners = _corners(first, speeds, direction, box, size, rng, bool(o.get("bounce")))
            clip.append(MovingShape(o["shape"], o["color"], box, shade, corners))
        if all(_clear(a, b) for i, a in enumerate(clip) for b in clip[i + 1:]):
            return clip
    raise ValueError(f"no clip without overlapping shapes for {meta} in {MAX_TRIES} tries; use a larger size")


def render_clip(clip: list[MovingShape], frames: int = FRAMES, size: int = IMAGE_SIZE) -> np.ndarray:
    """Pixels (F, 3, size, size) float32 in [0, 1] of ``clip`` on the plain background."""
    video = np.empty((frames, 3, size, size), dtype=np.float32)
    video[:] = np.asarray(BACKGROUND, dtype=np.float32)[None, :, None, None]
    for s in clip:
        if len(s.corners) != frames:
            raise ValueError(f"clip object has {len(s.corners)} frames, expected {frames}")
        m = shape_mask(s.shape, s.size)
        rgb = np.clip(np.asarray(PALETTE[s.color]) + np.asarray(s.shade), 0.0, 1.0).astype(np.float32)
        for f, c in enumerate(s.corners):
            if c is not None:
                video[f, :, c[0]:c[0] + s.size, c[1]:c[1] + s.size][:, m] = rgb[:, None]
    return video


def render_meta(meta: dict, seed: int, frames: int = FRAMES, size: int = IMAGE_SIZE) -> np.ndarray:
    """Pixels (F, 3, size, size) of a random clip for ``meta``, deterministic in ``seed``."""
    return render_clip(sample_clip(meta, np.random.default_rng(seed), frames, size), frames, size)


def render_batch(metas: list[dict], seed: int, frames: int = FRAMES, size: int = IMAGE_SIZE) -> np.ndarray:
    """Videos (B, F, 3, size, size) float32: clip b drawn from generator (seed, b), so one row can be redrawn."""
    return np.stack([render_clip(sample_clip(m, np.random.default_rng([seed, b]), frames, size), frames, size)
                     for b, m in enumerate(metas)])
