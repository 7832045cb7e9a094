"""Grid assembly, media files and the gallery, on synthetic tensors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from flowrl.eval.gallery import GalleryEntry, render_gallery
from flowrl.eval.grid import font, grid_layout, make_grid, to_uint8, upscale, wrap
from flowrl.eval.media import pad_to_multiple, save_png, save_video


def _color_tiles(R, C, h=8, w=12, frames=None):
    """Tile (r, c) (frame f) has the constant colour (r/R, c/C, f/F)."""
    F = frames or 1
    t = torch.zeros(R, C, F, 3, h, w)
    for r in range(R):
        for c in range(C):
            for f in range(F):
                t[r, c, f, 0], t[r, c, f, 1], t[r, c, f, 2] = r / R, c / C, f / F
    return t if frames else t[:, :, 0]


def test_to_uint8_rounds_and_moves_channels():
    x = torch.tensor([0.0, 0.5, 1.0, 1.5, -1.0]).view(1, 5, 1).expand(3, 5, 1)
    out = to_uint8(x)
    assert out.shape == (5, 1, 3) and out.dtype == np.uint8
    assert out[:, 0, 0].tolist() == [0, 128, 255, 255, 0]
    with pytest.raises(ValueError, match="float"):
        to_uint8(torch.zeros(3, 2, 2, dtype=torch.uint8))


def test_image_grid_places_every_tile():
    R, C, h, w = 2, 3, 8, 12
    tiles = _color_tiles(R, C, h, w)
    canvas = make_grid(tiles, ["prompt a", "prompt b"], ["s0", "s1", "s2"], [["x=1"] * C] * R, min_tile=32)
    factor = 4  # ceil(32 / min(8, 12))
    layout = grid_layout(R, C, h * factor, w * factor, caption_lines=2, fnt=font())
    assert canvas.shape == (layout.height, layout.width, 3)
    for r in range(R):
        for c in range(C):
            y, x = layout.tile_origin(r, c)
            block = canvas[y:y + h * factor, x:x + w * factor]
            expect = to_uint8(tiles[r, c])[0, 0]
            assert (block == expect).all(), (r, c)
            caption = canvas[y + h * factor:y + h * factor + layout.caption_h, x:x + w * factor]
            assert (caption < 128).any(), "caption text drawn under each tile"
    label_band = canvas[layout.header_h:, :layout.label_w]
    header_band = canvas[:layout.header_h, layout.label_w:]
    assert (label_band < 128).any() and (header_band < 128).any()


def test_grid_without_text_is_just_tiles_and_padding():
    tiles = _color_tiles(1, 2, 4, 4)
    canvas = make_grid(tiles, min_tile=4, pad=1)
    assert canvas.shape == (1 + 4 + 1, 1 + 2 * 5, 3)
    assert (canvas[1:5, 1:5] == to_uint8(tiles[0, 0])[0, 0]).all()
    assert (canvas[0] == 255).all() and (canvas[:, 5] == 255).all()


def test_video_grid_has_one_canvas_per_frame():
    F = 3
    tiles = _color_tiles(2, 2, 8, 8, frames=F)
    frames = make_grid(tiles, ["a", "b"], ["c", "d"], [["s"] * 2] * 2, min_tile=8)
    assert frames.ndim == 4 and frames.shape[0] == F
    layout = grid_layout(2, 2, 8, 8, caption_lines=2, fnt=font())
    y, x = layout.tile_origin(1, 1)
    for f in range(F):
        assert (frames[f, y:y + 8, x:x + 8] == to_uint8(tiles[1, 1, f])[0, 0]).all()
    assert (frames[0] != frames[1]).any()


def test_numpy_uint8_tiles_equal_tensor_tiles():
    tiles = _color_tiles(2, 2)
    as_np = to_uint8(tiles)
    assert np.array_equal(make_grid(tiles, ["a", "b"]), make_grid(as_np, ["a", "b"]))


def test_bad_grid_input_is_explained():
    with pytest.raises(ValueError, match=r"\(rows, cols, 3, H, W\)"):
        make_grid(torch.zeros(2, 3, 8, 8))
    with pytest.raises(ValueError, match="row_labels has 1 entries for 2 rows"):
        make_grid(_color_tiles(2, 2), ["only one"])
    with pytest.raises(ValueError, match="captions must be 2 rows of 2"):
        make_grid(_color_tiles(2, 2), captions=[["a"]])
    with pytest.raises(ValueError, match="uint8"):
        make_grid(np.zeros((1, 1, 4, 4, 3), np.float32))


def test_upscale_is_nearest_neighbour():
    a = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    up = upscale(a, 3)
    assert up.shape == (6, 6, 3) and (up[:3, :3] == a[0, 0]).all() and (up[3:, 3:] == a[1, 1]).all()


def test_wrap_respects_width_and_marks_cuts():
    fnt = font()
    lines = wrap("a fairly long prompt about a red circle left of a blue square " * 3, 120, fnt, 2)
    assert len(lines) == 2 and lines[-1].endswith("…")
    from PIL import ImageDraw

    draw = ImageDraw.Draw(Image.new("L", (1, 1)))
    assert all(draw.textlength(ln, font=fnt) <= 120 for ln in lines)
    assert wrap("short", 120, fnt, 2) == ["short"]


def test_png_and_video_files_round_trip(tmp_path):
    canvas = make_grid(_color_tiles(1, 2), ["p"], min_tile=16)
    png = Image.open(save_png(canvas, tmp_path / "g.png"))
    assert np.array_equal(np.asarray(png), canvas)

    frames = make_grid(_color_tiles(1, 2, 16, 16, frames=4), ["p"], ["a", "b"], min_tile=16)
    gif = Image.open(save_video(frames, tmp_path / "g.gif", fps=4))
    assert gif.n_frames == 4 and gif.size == (frames.shape[2], frames.shape[1])

    import imageio.v2 as imageio

    mp4 = save_video(frames, tmp_path / "g.mp4", fps=4)
    read = np.stack([f for f in imageio.get_reader(mp4, format="FFMPEG")])  # list() trips on len=inf
    assert read.shape[0] == 4
    assert read.shape[1] % 16 == 0 and read.shape[2] % 16 == 0
    h, w = frames.shape[1:3]
    err = np.abs(read[:, :h, :w].astype(int) - frames.astype(int)).mean()
    assert err < 12, err  # lossy H.264, but the same picture
    with pytest.raises(ValueError, match="'webm' not supported"):
        save_video(frames, tmp_path / "g.webm")


def test_pad_to_multiple():
    x = np.zeros((2, 17, 30, 3), np.uint8)
    assert pad_to_multiple(x, 16).shape == (2, 32, 32, 3)
    assert pad_to_multiple(np.zeros((1, 16, 16, 3), np.uint8), 16).shape == (1, 16, 16, 3)


def test_gallery_escapes_and_links():
    page = render_gallery("eval <step 3>", [GalleryEntry("grid_000.png", "prompts 1–2", ["a <b> & c", "d"]),
                                            GalleryEntry("grid_001.mp4", "video", ["e"], first_row=3)],
                          {"base": {"shapes": 0.25}, "trained": {"shapes": float("nan")}})
    assert "&lt;b&gt; &amp; c" in page and "<b>" not in page
    assert '<img src="grid_000.png"' in page and '<video src="grid_001.mp4"' in page
    assert "start='3'" in page and "0.25" in page and "–" in page
