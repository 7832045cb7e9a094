"""Procedural renderer of the shapes world: a scene spec → 32×32 RGB pixels, and prompt metadata → a random
scene that satisfies it, both deterministic from a seed (numpy only).

Each shape fills a square box of side ``size`` ∈ SIZES placed inside its 8×8 grid cell at pixel offset
(dy, dx) with the box kept inside the cell's first 7 rows/columns, so neighbouring shapes never touch (≥ 1 px gap).
"""
from __future__ import annotations

from functools import cache

import numpy as np

from flowrl.data.shapes.world import (
    BACKGROUND,
    CELL,
    GRID,
    IMAGE_SIZE,
    MAX_OBJECTS,
    PALETTE,
    SHADE_JITTER,
    SIZES,
    PlacedShape,
)


@cache
def shape_mask(shape: str, size: int) -> np.ndarray:
    """Boolean (size, size) raster of a filled shape: square = full box; circle = pixels whose centre lies
    within radius size/2 − 0.1 of the box centre; triangle = upright isosceles, row y spanning a half-width of
    (y + 1)/2 px about the centre column."""
    y, x = np.mgrid[:size, :size].astype(np.float64)
    c = (size - 1) / 2
    if shape == "square":
        return np.ones((size, size), dtype=bool)
    if shape == "circle":
        r = size / 2 - 0.1
        return (y - c) ** 2 + (x - c) ** 2 <= r * r
    if shape == "triangle":
        return np.abs(x - c) <= (y + 1) / 2 - 0.01
    raise ValueError(f"unknown shape {shape!r}; expected one of circle, square, triangle")


def render_scene(scene: list[PlacedShape], size: int = IMAGE_SIZE) -> np.ndarray:
    """Pixels (3, size, size) float32 in [0, 1] of ``scene`` on the plain background."""
    if size != IMAGE_SIZE:
        raise ValueError(f"the shapes world renders {IMAGE_SIZE}×{IMAGE_SIZE} only, got size={size}")
    img = np.empty((3, size, size), dtype=np.float32)
    img[:] = np.asarray(BACKGROUND, dtype=np.float32)[:, None, None]
    for s in scene:
        m = shape_mask(s.shape, s.size)
        y0, x0 = s.row * CELL + s.offset[0], s.col * CELL + s.offset[1]
        rgb = np.clip(np.asarray(PALETTE[s.color]) + np.asarray(s.shade), 0.0, 1.0).astype(np.float32)
        region = img[:, y0:y0 + s.size, x0:x0 + s.size]
        region[:, m] = rgb[:, None]
    return img


def _cells_for(meta: dict, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Grid cells for the meta's objects in order (objects[0] × count, objects[1] × count, ...)."""
    n = sum(o["count"] for o in meta["objects"])
    if not 1 <= n <= MAX_OBJECTS:
        raise ValueError(f"a scene holds 1..{MAX_OBJECTS} objects, the metadata asks for {n}")
    all_cells = [(r, c) for r in range(GRID) for c in range(GRID)]
    pos, rel = meta.get("position"), meta.get("relation")
    if pos is not None:
        half = GRID // 2
        keep = {"left": lambda r, c: c < half, "right": lambda r, c: c >= half,
                "top": lambda r, c: r < half, "bottom": lambda r, c: r >= half}[pos]
        allowed = [rc for rc in all_cells if keep(*rc)]
        return [allowed[i] for i in rng.choice(len(allowed), size=n, replace=False)]
    if rel is not None:
        ok = {"above": lambda a, b: a[0] < b[0], "below": lambda a, b: a[0] > b[0],
              "left of": lambda a, b: a[1] < b[1], "right of": lambda a, b: a[1] > b[1]}[rel]
        pairs = [(a, b) for a in all_cells for b in all_cells if ok(a, b)]
        a, b = pairs[rng.integers(len(pairs))]
        return [a, b]
    return [all_cells[i] for i in rng.choice(len(all_cells), size=n, replace=False)]


def sample_scene(meta: dict, rng: np.random.Generator) -> list[PlacedShape]:
    """A random scene that satisfies prompt metadata ``meta`` (see grammar.py for its keys)."""
    cells = iter(_cells_for(meta, rng))
    scene = []
    for obj in meta["objects"]:
        for _ in range(obj["count"]):
            row, col = next(cells)
            size = int(SIZES[rng.integers(len(SIZES))])
            slack = CELL - 1 - size
            offset = (int(rng.integers(slack + 1)), int(rng.integers(slack + 1)))
            shade = tuple(float(v) for v in rng.uniform(-SHADE_JITTER, SHADE_JITTER, size=3))
            scene.append(PlacedShape(obj["shape"], obj["color"], row, col, size, offset, shade))
    return scene


def render_meta(meta: dict, seed: int) -> np.ndarray:
    """Pixels (3, 32, 32) of a random scene for ``meta``, deterministic in ``seed``."""
    return render_scene(sample_scene(meta, np.random.default_rng(seed)))


def render_batch(metas: list[dict], seed: int) -> np.ndarray:
    """Pixels (B, 3, 32, 32) float32: scene b drawn from generator (seed, b), so one row can be redrawn alone."""
    return np.stack([render_scene(sample_scene(m, np.random.default_rng([seed, b])))
                     for b, m in enumerate(metas)])
