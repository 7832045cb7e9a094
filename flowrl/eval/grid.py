"""Grid assembly: tiles (rows × columns of images or videos) plus text → one uint8 canvas per frame.

Pure functions of tensors and strings (no model, no file I/O), so the layout is testable on synthetic tiles.

Layout (all sizes in pixels, ``s`` = integer upscale so small tiles stay readable, nearest neighbour)::

    ┌───────────┬──────────────┬──────────────┐
    │           │ column label │ column label │   header: ``header_lines`` text lines
    ├───────────┼──────────────┼──────────────┤
    │ row label │   tile s·H   │   tile       │
    │ (wrapped) │   caption    │   caption    │   caption: ``caption_lines`` text lines under each tile
    └───────────┴──────────────┴──────────────┘

Text is drawn with PIL's default font (``ImageFont.load_default``) in black on white.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

__all__ = ["GridLayout", "compose_grid", "grid_layout", "make_grid", "source_tiles", "text_layer", "to_uint8",
           "upscale"]

BACKGROUND = 255


@dataclass(frozen=True)
class GridLayout:
    """Pixel geometry of a grid: ``rows × cols`` tiles of ``tile_h × tile_w`` (after upscaling)."""

    rows: int
    cols: int
    tile_h: int
    tile_w: int
    pad: int
    label_w: int      # width of the row-label column (0: none)
    header_h: int     # height of the column-label band (0: none)
    caption_h: int    # height of the caption band under each tile (0: none)
    line_h: int

    @property
    def cell_w(self) -> int:
        return self.tile_w + self.pad

    @property
    def cell_h(self) -> int:
        return self.tile_h + self.caption_h + self.pad

    @property
    def width(self) -> int:
        return self.pad + self.label_w + self.cols * self.cell_w

    @property
    def height(self) -> int:
        return self.pad + self.header_h + self.rows * self.cell_h

    def tile_origin(self, r: int, c: int) -> tuple[int, int]:
        """(y, x) of tile (r, c)'s top-left corner."""
        return self.pad + self.header_h + r * self.cell_h, self.pad + self.label_w + c * self.cell_w


FONT_SIZE = 12


def font(size: int = FONT_SIZE) -> ImageFont.ImageFont:
    """PIL's default font (the bundled FreeType face at ``size`` px; the bitmap font without FreeType)."""
    return ImageFont.load_default(size=size)


def line_height(fnt) -> int:
    box = fnt.getbbox("Agy|")
    return box[3] + 2


def grid_layout(rows: int, cols: int, tile_h: int, tile_w: int, *, row_labels: bool = True,
                col_labels: bool = True, caption_lines: int = 2, header_lines: int = 2, label_w: int = 180,
                pad: int = 4, fnt=None) -> GridLayout:
    """The geometry for ``rows × cols`` tiles of ``tile_h × tile_w`` with optional text bands."""
    if rows < 1 or cols < 1:
        raise ValueError(f"a grid needs at least one row and one column, got {rows}×{cols}")
    lh = line_height(fnt or font())
    return GridLayout(rows, cols, tile_h, tile_w, pad, label_w if row_labels else 0,
                      header_lines * lh + pad if col_labels else 0, caption_lines * lh, lh)


def to_uint8(pixels: Tensor) -> np.ndarray:
    """Float pixels in [0, 1], channels at dim −3 → uint8 numpy with channels last (round to nearest)."""
    if not pixels.is_floating_point():
        raise ValueError(f"pixels must be float in [0, 1], got dtype {pixels.dtype}")
    x = (pixels.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return x.movedim(-3, -1).cpu().numpy()


def source_tiles(images: Sequence | None, tile_shape: Sequence[int]) -> np.ndarray | None:
    """Each prompt's first source image as a uint8 tile (P, *tile_shape) beside the results: resized (bilinear,
    antialiased) to the tiles' h × w, repeated over frames for video tiles, white for a prompt without one;
    None when ``images`` is None (no prompt has a source)."""
    if images is None:
        return None
    h, w = int(tile_shape[-3]), int(tile_shape[-2])
    out = []
    for row in images:
        img = torch.ones(1, 3, h, w) if not row else torch.nn.functional.interpolate(
            row[0][None].float(), size=(h, w), mode="bilinear", antialias=True, align_corners=False)
        tile = to_uint8(img[0])
        out.append(np.repeat(tile[None], tile_shape[0], 0) if len(tile_shape) == 4 else tile)
    return np.stack(out)


def upscale(tiles: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour upscaling of (..., H, W, 3) by an integer factor."""
    if factor == 1:
        return tiles
    return tiles.repeat(factor, axis=-3).repeat(factor, axis=-2)


def wrap(text: str, width_px: int, fnt, max_lines: int) -> list[str]:
    """Greedy word wrap to ``width_px``; the last kept line ends with '…' when text was cut."""
    draw = ImageDraw.Draw(Image.new("L", (1, 1)))
    lines: list[str] = []
    for paragraph in str(text).split("\n"):
        line = ""
        for word in paragraph.split(" "):
            trial = f"{line} {word}".strip()
            if draw.textlength(trial, font=fnt) <= width_px or not line:
                line = trial
            else:
                lines.append(line)
                line = word
        lines.append(line)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        last = lines[-1]
        while last and draw.textlength(last + "…", font=fnt) > width_px:
            last = last[:-1]
        lines[-1] = last + "…"
    # hard-cut single words wider than the box
    out = []
    for ln in lines:
        while ln and draw.textlength(ln, font=fnt) > width_px:
            ln = ln[:-1]
        out.append(ln)
    return out


def _draw_lines(draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str, width: int, max_lines: int,
                fnt, lh: int) -> None:
    x, y = xy
    for i, ln in enumerate(wrap(text, width, fnt, max_lines)):
        draw.text((x, y + i * lh), ln, fill=0, font=fnt)


def text_layer(layout: GridLayout, row_labels: Sequence[str] | None = None,
               col_labels: Sequence[str] | None = None, captions: Sequence[Sequence[str]] | None = None,
               fnt=None) -> np.ndarray:
    """The (H, W, 3) uint8 white canvas with every label and caption drawn (tiles are pasted later)."""
    fnt = fnt or font()
    img = Image.new("L", (layout.width, layout.height), BACKGROUND)
    draw = ImageDraw.Draw(img)
    lh, pad = layout.line_h, layout.pad
    if col_labels is not None and layout.header_h:
        for c, text in enumerate(col_labels):
            _, x = layout.tile_origin(0, c)
            _draw_lines(draw, (x, pad), text, layout.tile_w, (layout.header_h - pad) // lh, fnt, lh)
    if row_labels is not None and layout.label_w:
        for r, text in enumerate(row_labels):
            y, _ = layout.tile_origin(r, 0)
            max_lines = max(1, (layout.tile_h + layout.caption_h) // lh)
            _draw_lines(draw, (pad, y), text, layout.label_w - 2 * pad, max_lines, fnt, lh)
    if captions is not None and layout.caption_h:
        for r, row in enumerate(captions):
            for c, text in enumerate(row):
                y, x = layout.tile_origin(r, c)
                _draw_lines(draw, (x, y + layout.tile_h), text, layout.tile_w, layout.caption_h // lh, fnt, lh)
    return np.repeat(np.asarray(img)[..., None], 3, axis=-1)


def compose_grid(tiles: np.ndarray, layout: GridLayout, background: np.ndarray | None = None) -> np.ndarray:
    """Paste uint8 tiles (R, C, [F,] h, w, 3) into the layout; returns (H, W, 3) or (F, H, W, 3).

    ``background`` is the text layer (H, W, 3); white when None.
    """
    video = tiles.ndim == 6
    R, C = tiles.shape[:2]
    h, w = tiles.shape[-3:-1]
    if (R, C, h, w) != (layout.rows, layout.cols, layout.tile_h, layout.tile_w):
        raise ValueError(f"tiles {tiles.shape[:2]} of {h}×{w} do not match the layout "
                         f"{layout.rows}×{layout.cols} of {layout.tile_h}×{layout.tile_w}")
    if background is None:
        background = np.full((layout.height, layout.width, 3), BACKGROUND, np.uint8)
    frames = tiles.shape[2] if video else 1
    canvas = np.repeat(background[None], frames, axis=0)
    for r in range(R):
        for c in range(C):
            y, x = layout.tile_origin(r, c)
            canvas[:, y:y + h, x:x + w] = tiles[r, c] if video else tiles[r, c][None]
    return canvas if video else canvas[0]


def make_grid(pixels: Tensor | np.ndarray, row_labels: Sequence[str] | None = None,
              col_labels: Sequence[str] | None = None, captions: Sequence[Sequence[str]] | None = None, *,
              min_tile: int = 128, caption_lines: int = 2, header_lines: int = 2, label_w: int = 180,
              pad: int = 4) -> np.ndarray:
    """An annotated grid of images → (H', W', 3) uint8, or of videos → (F, H', W', 3) uint8.

    ``pixels``: float tensor in [0, 1] shaped (R, C, 3, H, W) / (R, C, F, 3, H, W), or uint8 numpy tiles
    shaped (R, C, H, W, 3) / (R, C, F, H, W, 3). Tiles smaller than ``min_tile`` are upscaled by an integer
    factor (nearest neighbour) so captions fit.
    """
    tiles = _as_tiles(pixels)
    R, C = tiles.shape[:2]
    _check_text("row_labels", row_labels, R)
    _check_text("col_labels", col_labels, C)
    if captions is not None and (len(captions) != R or any(len(row) != C for row in captions)):
        raise ValueError(f"captions must be {R} rows of {C} strings")
    h, w = tiles.shape[-3:-1]
    factor = max(1, math.ceil(min_tile / min(h, w)))
    tiles = upscale(tiles, factor)
    fnt = font()
    layout = grid_layout(R, C, h * factor, w * factor, row_labels=row_labels is not None,
                         col_labels=col_labels is not None, caption_lines=caption_lines if captions else 0,
                         header_lines=header_lines, label_w=label_w, pad=pad, fnt=fnt)
    return compose_grid(tiles, layout, text_layer(layout, row_labels, col_labels, captions, fnt))


def _as_tiles(pixels: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(pixels, Tensor):
        if pixels.dim() not in (5, 6) or pixels.shape[-3] != 3:
            raise ValueError("grid pixels must be (rows, cols, 3, H, W) images or (rows, cols, F, 3, H, W) videos "
                             f"in [0, 1], got shape {tuple(pixels.shape)}")
        return to_uint8(pixels)
    if pixels.dtype != np.uint8 or pixels.ndim not in (5, 6) or pixels.shape[-1] != 3:
        raise ValueError("grid tiles as numpy must be uint8 (rows, cols, H, W, 3) or (rows, cols, F, H, W, 3), "
                         f"got {pixels.dtype} {pixels.shape}")
    return pixels


def _check_text(name: str, labels: Sequence[str] | None, n: int) -> None:
    if labels is not None and len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} entries for {n} {'rows' if 'row' in name else 'columns'}")
