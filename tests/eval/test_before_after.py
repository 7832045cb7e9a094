"""The end-of-run comparison image (before | after grid pages, same prompts and seeds) and the eval index page."""
import numpy as np
from PIL import Image

from flowrl.eval import before_after
from flowrl.eval.grid import make_grid
from flowrl.eval.media import save_png


def page(rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tiles = rng.integers(0, 255, (rows, 3, 32, 32, 3), dtype=np.uint8)
    captions = [[f"palette_distance=0.0{r}\nshapes=1\nshapes_clean=1" for _ in range(3)] for r in range(rows)]
    return make_grid(tiles, [f"{r}. prompt" for r in range(rows)], ["seed 0", "seed 1", "seed 2"], captions,
                     caption_lines=3)


def test_gallery_crops_each_grid_page_to_its_first_prompts(tmp_path):
    full = page(8)
    path = save_png(full, tmp_path / "grid_000.png")
    crop = before_after.grid_rows(path, rows=2, cols=3)
    assert crop.width == full.shape[1] and crop.height < full.shape[0] / 3
    assert np.array_equal(np.asarray(crop), full[:crop.height])      # the top of the page, untouched
    out = before_after.side_by_side([("before", path), ("after", path)], tmp_path / "g.png", rows=2, cols=3)
    img = Image.open(out)
    assert img.width == 2 * full.shape[1] and img.height > crop.height
    short = page(3)                                                     # a last page of 3 prompts
    crop = before_after.grid_rows(save_png(short, tmp_path / "grid_001.png"), rows=2, cols=3)
    assert crop.height < short.shape[0] and np.array_equal(np.asarray(crop), short[:crop.height])




def test_before_after_puts_the_two_first_pages_side_by_side_and_indexes_both(tmp_path):
    for tag, seed in (("before", 0), ("after", 1)):
        (tmp_path / tag).mkdir()
        save_png(page(8, seed), tmp_path / tag / "grid_000.png")
        (tmp_path / tag / "index.html").write_text("<html></html>")
    out = before_after.write_before_after(tmp_path, cols=3, rows=8)
    img = np.asarray(Image.open(out).convert("RGB"))
    left, right = page(8, 0), page(8, 1)
    rows = before_after.grid_rows(tmp_path / "before" / "grid_000.png", rows=8, cols=3).height   # 8 prompts' rows
    head, w = img.shape[0] - rows, left.shape[1]
    assert img.shape[1] == 2 * w and head > 0
    # before on the left, after on the right, the same rows (column 0 of each holds the divider line)
    assert np.array_equal(img[head:, 1:w], left[:rows, 1:])
    assert np.array_equal(img[head:, w + 1:], right[:rows, 1:])
    index = (tmp_path / "index.html").read_text()
    assert "before/index.html" in index and "after/index.html" in index and "before_after.png" in index


def test_video_grids_give_no_image_but_still_an_index(tmp_path):
    for tag in ("before", "after"):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "grid_000.mp4").write_bytes(b"")
        (tmp_path / tag / "index.html").write_text("<html></html>")
    assert before_after.write_before_after(tmp_path, cols=3) is None
    assert "after/index.html" in (tmp_path / "index.html").read_text()
