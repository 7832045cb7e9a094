"""The end-of-run comparison: evaluation grid pages side by side (before | after, the same prompts and seeds in
the same rows) and ``eval/index.html``, the page that links every evaluation's gallery and the comparison.

    side_by_side([("before", "eval/before/grid_000.png"), ("after", "eval/after/grid_000.png")], "cmp.png", cols=3)
    write_before_after(run_dir / "eval", cols=3)      # → eval/before_after.png (None for video grids)
"""
from __future__ import annotations

import html
from pathlib import Path

from PIL import Image, ImageDraw

PAGE_ROWS = 8          # write_grids' rows_per_page: a page holds 1 to 8 prompts
IMAGE = "before_after.png"


def grid_rows(path: str | Path, rows: int, cols: int) -> Image.Image:
    """The first ``rows`` prompts of an evaluation grid page (``flowrl.eval.run.write_grids``: up to
    ``PAGE_ROWS`` prompts × ``cols`` seeds with captions); the whole page when its size matches no such layout."""
    from flowrl.eval.grid import grid_layout

    img = Image.open(path).convert("RGB")
    probe = grid_layout(1, cols, 1, 1)
    tile = (img.width - probe.pad - probe.label_w) // cols - probe.pad
    for page_rows in range(1, PAGE_ROWS + 1):
        for lines in range(1, 5):
            layout = grid_layout(page_rows, cols, tile, tile, caption_lines=lines)
            if (layout.width, layout.height) == img.size:
                return img.crop((0, 0, img.width, layout.tile_origin(min(rows, page_rows), 0)[0]))
    return img


def side_by_side(columns: list[tuple[str, str | Path]], out: str | Path, rows: int = 4, cols: int = 3) -> Path:
    """Grid pages side by side, each under its title: [(title, grid PNG path)] → one PNG at ``out``."""
    from flowrl.eval.grid import font, line_height

    if not columns:
        raise ValueError("side_by_side: no columns given")
    pages = [(title, grid_rows(path, rows, cols)) for title, path in columns]
    fnt = font(16)
    head = line_height(fnt) + 12
    img = Image.new("RGB", (sum(p.width for _, p in pages), head + max(p.height for _, p in pages)), "white")
    draw, x = ImageDraw.Draw(img), 0
    for title, page in pages:
        draw.text((x + 8, 6), title, fill=(0, 0, 0), font=fnt)
        img.paste(page, (x, head))
        draw.line([(x, 0), (x, img.height)], fill=(200, 200, 200), width=1)
        x += page.width
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    img.save(out, optimize=True)
    return out


def write_before_after(eval_dir: str | Path, cols: int, rows: int = PAGE_ROWS,
                       tags: tuple[str, str] = ("before", "after")) -> Path | None:
    """``eval_dir/before_after.png`` from the first grid page of the two evaluations ``tags`` (None when either
    page is not a PNG, e.g. video grids), then ``eval_dir/index.html`` linking it and every evaluation's page."""
    eval_dir = Path(eval_dir)
    pages = [eval_dir / tag / "grid_000.png" for tag in tags]
    image = None
    if all(p.is_file() for p in pages):
        image = side_by_side([(f"{tag} (same prompts and seeds)", p) for tag, p in zip(tags, pages)],
                             eval_dir / IMAGE, rows=rows, cols=cols)
    write_index(eval_dir, image)
    return image


def write_index(eval_dir: Path, image: Path | None) -> Path:
    """``eval_dir/index.html``: the before | after image (if any) and a link to each ``<tag>/index.html``."""
    links = "".join(f"<li><a href='{html.escape(p.parent.name, quote=True)}/index.html'>{html.escape(p.parent.name)}"
                    f"</a></li>" for p in sorted(eval_dir.glob("*/index.html")))
    figure = (f"<p><a href='{IMAGE}'><img src='{IMAGE}' alt='before | after' style='max-width:100%'></a></p>"
              if image is not None else "")
    path = eval_dir / "index.html"
    path.write_text("<!doctype html><html><head><meta charset='utf-8'><title>evaluations</title></head><body>"
                    f"<h1>evaluations</h1>{figure}<ul>{links}</ul></body></html>\n")
    return path
