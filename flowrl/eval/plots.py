"""Training curves from ``metrics.jsonl`` drawn with PIL (no plotting library needed): one panel per metric.

    plot_run("runs/x")                       # → runs/x/curves.png: reward/*/mean, eval/*/mean, loss/* panels
    plot_metrics([rec...], ["loss/ratio"])   # → uint8 (H, W, 3) canvas

Each panel maps step x ∈ [x_min, x_max] and value y ∈ [y_min, y_max] linearly onto its plot area; NaN / null
values break the line (a reward that does not apply is not drawn as zero).
"""
from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from flowrl.eval.grid import font, line_height

__all__ = ["DEFAULT_PATTERNS", "line_panel", "plot_metrics", "plot_run", "series"]

DEFAULT_PATTERNS = ("reward/*/mean", "eval/*/mean", "adv/zero_std_frac", "loss/*", "train/grad_norm")
LINE_COLOR = (31, 119, 180)
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 56, 10, 8, 8


def series(records: Sequence[dict], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of metric ``name``; missing or null values become NaN."""
    xs, ys = [], []
    for r in records:
        if name in r and "step" in r:
            v = r[name]
            xs.append(float(r["step"]))
            ys.append(float("nan") if v is None else float(v))
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def _span(lo: float, hi: float) -> tuple[float, float]:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return 0.0, 1.0
    if hi - lo < 1e-12:
        pad = max(abs(hi), 1.0) * 0.05
        return lo - pad, hi + pad
    return lo, hi


def to_pixels(xs: np.ndarray, ys: np.ndarray, box: tuple[int, int, int, int], xr, yr) -> np.ndarray:
    """Data → pixel coordinates inside ``box`` = (left, top, right, bottom); y grows upwards."""
    left, top, right, bottom = box
    px = left + (xs - xr[0]) / (xr[1] - xr[0]) * (right - left)
    py = bottom - (ys - yr[0]) / (yr[1] - yr[0]) * (bottom - top)
    return np.stack([px, py], axis=-1)


def line_panel(xs: np.ndarray, ys: np.ndarray, title: str, width: int = 360, height: int = 200) -> np.ndarray:
    """One chart: title, frame, y-range labels, x-range labels, the polyline (NaN breaks it)."""
    fnt = font()
    lh = line_height(fnt)
    img = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    box = (MARGIN_LEFT, MARGIN_TOP + lh, width - MARGIN_RIGHT, height - MARGIN_BOTTOM - lh)
    draw.text((MARGIN_LEFT, MARGIN_TOP // 2), title, fill=(0, 0, 0), font=fnt)
    draw.rectangle(box, outline=(150, 150, 150))
    ok = np.isfinite(ys)
    if xs.size and ok.any():
        xr = _span(float(xs.min()), float(xs.max()))
        yr = _span(float(ys[ok].min()), float(ys[ok].max()))
        for y_val, y_px in ((yr[1], box[1]), (yr[0], box[3] - lh + 2)):
            draw.text((2, y_px), f"{y_val:.4g}", fill=(60, 60, 60), font=fnt)
        draw.text((box[0], box[3] + 2), f"{xr[0]:g}", fill=(60, 60, 60), font=fnt)
        end = f"{xr[1]:g}"
        draw.text((box[2] - draw.textlength(end, font=fnt), box[3] + 2), end, fill=(60, 60, 60), font=fnt)
        pts = to_pixels(xs, ys, box, xr, yr)
        segment: list[tuple[float, float]] = []
        for p, good in zip(pts, ok):
            if good:
                segment.append((float(p[0]), float(p[1])))
                continue
            _draw_segment(draw, segment)
            segment = []
        _draw_segment(draw, segment)
    else:
        draw.text((box[0] + 4, box[1] + 4), "no finite values", fill=(120, 120, 120), font=fnt)
    return np.asarray(img)


def _draw_segment(draw: ImageDraw.ImageDraw, segment: list[tuple[float, float]]) -> None:
    if len(segment) == 1:
        x, y = segment[0]
        draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=LINE_COLOR)
    elif segment:
        draw.line(segment, fill=LINE_COLOR, width=2)


def matching_names(records: Sequence[dict], patterns: Sequence[str]) -> list[str]:
    """Metric names (in pattern order, then sorted) matching any shell-style pattern."""
    names = sorted({k for r in records for k in r if k not in ("step", "time")})
    out: list[str] = []
    for pat in patterns:
        out += [n for n in names if fnmatch.fnmatchcase(n, pat) and n not in out]
    return out


def plot_metrics(records: Sequence[dict], names: Sequence[str], columns: int = 3, width: int = 360,
                 height: int = 200) -> np.ndarray:
    """Panels for ``names`` laid out ``columns`` wide → (H, W, 3) uint8."""
    if not names:
        raise ValueError("plot_metrics: no metric names to plot (check the patterns against metrics.jsonl)")
    panels = [line_panel(*series(records, n), n, width, height) for n in names]
    rows = math.ceil(len(panels) / columns)
    canvas = np.full((rows * height, min(columns, len(panels)) * width, 3), 255, np.uint8)
    for i, panel in enumerate(panels):
        r, c = divmod(i, columns)
        canvas[r * height:(r + 1) * height, c * width:(c + 1) * width] = panel
    return canvas


def plot_run(run_dir: str | Path, patterns: Sequence[str] = DEFAULT_PATTERNS, out: str | Path | None = None) -> Path:
    """Write the curves of ``run_dir/metrics.jsonl`` matching ``patterns`` to ``out`` (default run_dir/curves.png)."""
    from flowrl.eval.media import save_png
    from flowrl.training.metrics_log import read_metrics

    records = read_metrics(run_dir)
    return save_png(plot_metrics(records, matching_names(records, patterns)), out or Path(run_dir) / "curves.png")
