"""The moving-shapes world's fixed vocabulary: clip size, motion words, speeds, and the clip record.

Clips are F frames (default 8) of 32×32 RGB showing 1–3 filled shapes of the image world (same palette, shapes,
box sides 6–7 px, shade jitter and background; ``flowrl.data.shapes.world``) moving in straight lines, bouncing
back, or appearing. Every object of a clip has its own colour, so the colour names an object's identity.
"""
from __future__ import annotations

from dataclasses import dataclass

from flowrl.data.shapes.world import BACKGROUND, COLORS, PALETTE, SHADE_JITTER, SHAPES, SIZES

__all__ = ["BACKGROUND", "COLORS", "DIRECTIONS", "FRAMES", "IMAGE_SIZE", "PALETTE", "SHADE_JITTER", "SHAPES",
           "SIZES", "SKILLS", "SPEEDS", "MovingShape", "axis_sign", "speed_px"]

FRAMES = 8            # default clip length
IMAGE_SIZE = 32       # default frame side

DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down")
PARTICIPLE = {"left": "moving left", "right": "moving right", "up": "rising", "down": "falling"}
VERB = {"left": "moves left", "right": "moves right", "up": "rises", "down": "falls"}
SPEEDS: tuple[str, ...] = ("slow", "fast")
SPEED_ADVERB = {"slow": "slowly", "fast": "quickly"}
# travel over the whole clip in px of a 32-px frame (scaled with the frame): slow / unspecified / fast
# (1, 2, 3 px per frame at 8 frames)
TRAVEL = {"slow": 7.0, "normal": 14.0, "fast": 21.0}

SKILLS: tuple[str, ...] = ("motion", "speed", "bounce", "pair", "order", "appear", "sequence")


def speed_px(speed: str, frames: int, size: int = IMAGE_SIZE) -> float:
    """Speed in px per frame of ``speed`` ("slow" | "normal" | "fast") for a clip of ``frames`` frames of side
    ``size``: TRAVEL·size/32 / (frames − 1)."""
    if frames < 4:
        raise ValueError(f"moving-shapes clips need at least 4 frames, got {frames}")
    return TRAVEL[speed] * size / IMAGE_SIZE / (frames - 1)


def axis_sign(direction: str) -> tuple[int, int]:
    """(axis, sign) of a direction: axis 0 = x (columns), 1 = y (rows, growing downwards)."""
    return {"left": (0, -1), "right": (0, 1), "up": (1, -1), "down": (1, 1)}[direction]


@dataclass(frozen=True)
class MovingShape:
    """One object of a clip: kind, palette colour, box side, RGB shade offset, and its box's top-left corner
    (y, x) in px per frame, None where the object is not (yet) in the clip."""

    shape: str
    color: str
    size: int
    shade: tuple[float, float, float]
    corners: tuple[tuple[int, int] | None, ...]
