"""The shapes world's fixed vocabulary: palette, background, shape kinds, grid, and the scene record.

Scenes are 32×32 RGB images of 1–4 filled shapes on a plain dark background. Every shape sits in one cell
of a 4×4 grid of 8×8-pixel cells (a coarse layout a tiny patch-8 transformer can learn on a CPU in minutes),
with a small jitter in size and colour shade. All colours are float RGB in [0, 1].
"""
from __future__ import annotations

from dataclasses import dataclass

IMAGE_SIZE = 32
GRID = 4
CELL = IMAGE_SIZE // GRID  # 8 px

BACKGROUND = (0.08, 0.08, 0.10)
PALETTE: dict[str, tuple[float, float, float]] = {
    "red": (0.86, 0.16, 0.16),
    "green": (0.16, 0.78, 0.24),
    "blue": (0.16, 0.31, 0.90),
    "yellow": (0.90, 0.82, 0.16),
    "purple": (0.63, 0.24, 0.78),
}
COLORS: tuple[str, ...] = tuple(PALETTE)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
SHAPE_PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles"}
COUNT_WORDS = {1: "a", 2: "two", 3: "three", 4: "four"}
MAX_OBJECTS = 4

POSITIONS: tuple[str, ...] = ("left", "right", "top", "bottom")
POSITION_PHRASES = {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom"}
RELATIONS: tuple[str, ...] = ("above", "below", "left of", "right of")
RELATION_PHRASES = {"above": "above", "below": "below", "left of": "to the left of", "right of": "to the right of"}
SKILLS: tuple[str, ...] = ("color", "counting", "position", "binding", "relation")

SHADE_JITTER = 0.05  # max per-channel shift of a shape's colour from its palette entry
SIZES = (6, 7)       # side of a shape's bounding box in px (jittered per shape)


@dataclass(frozen=True)
class PlacedShape:
    """One shape of a scene: kind, palette colour, grid cell (row, col), box side in px, pixel offset of the
    box inside the cell, and an RGB shade offset (each channel within ±SHADE_JITTER)."""

    shape: str
    color: str
    row: int
    col: int
    size: int = 7
    offset: tuple[int, int] = (0, 0)
    shade: tuple[float, float, float] = (0.0, 0.0, 0.0)


def palette_rgb() -> list[tuple[float, float, float]]:
    """Background followed by the palette colours in COLORS order (index 0 = background)."""
    return [BACKGROUND] + [PALETTE[c] for c in COLORS]
