"""Learning curves of several methods in one PNG, drawn with PIL (no plotting library in the environment):
per method the mean over seeds as a line with markers and mean ± standard error as a translucent band.

    plot_curves({"grpo": agg_grpo, "nft": agg_nft}, "curves_strict.png", metric="strict", x="rollout_nfe")

``agg_*`` are ``_learning_lib.aggregate`` results (``curve`` points with ``<x>_mean``, ``<metric>_mean`` and
``<metric>_se``); a missing SE (one seed) draws no band.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

COLORS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189), (140, 86, 75),
          (227, 119, 194), (127, 127, 127))
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 760, 460, 70, 20, 36, 48
TICKS = 5


def series(agg: dict, metric: str, x: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x means, metric means, metric SEs, NaN where missing) of an aggregate's curve, points without x or
    mean left out."""
    rows = []
    for p in agg["curve"]:
        xv, mv, se = p.get(f"{x}_mean", p.get(x)), p.get(f"{metric}_mean"), p.get(f"{metric}_se")
        if xv is not None and mv is not None:
            rows.append((xv, mv, math.nan if se is None else se))
    arr = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def _range(values: list[np.ndarray], pad: float = 0.05) -> tuple[float, float]:
    """(lo, hi) of the finite values, widened by ``pad`` of the span (of |hi| or 1 when the span is 0)."""
    v = np.concatenate([a[np.isfinite(a)] for a in values]) if values else np.zeros(0)
    if v.size == 0:
        return 0.0, 1.0
    lo, hi = float(v.min()), float(v.max())
    width = (hi - lo) * pad if hi > lo else max(abs(hi), 1.0) * 0.05
    return lo - width, hi + width


def plot_curves(methods: dict, path: str | Path, metric: str = "strict", x: str = "rollout_nfe") -> Path:
    """Write the PNG to ``path`` (parents created) and return it; ``methods``: name → ``aggregate`` result."""
    from flowrl.eval.grid import font, line_height
    from flowrl.eval.media import save_png

    if not methods:
        raise ValueError("plot_curves: no methods given")
    data = {name: series(agg, metric, x) for name, agg in methods.items()}
    xr = _range([d[0] for d in data.values()], pad=0.0)
    yr = _range([d[1] + np.nan_to_num(d[2]) for d in data.values()] + [d[1] - np.nan_to_num(d[2])
                                                                        for d in data.values()])
    box = (LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM)

    def px(xs, ys):
        return (box[0] + (xs - xr[0]) / (xr[1] - xr[0]) * (box[2] - box[0]),
                box[3] - (ys - yr[0]) / (yr[1] - yr[0]) * (box[3] - box[1]))

    img = Image.new("RGBA", (WIDTH, HEIGHT), (255, 255, 255, 255))
    fnt, lh = font(), line_height(font())
    _axes(ImageDraw.Draw(img), box, xr, yr, fnt, lh, f"{metric} vs {x} (mean ± SE over seeds)", x)
    for i, (name, (xs, ys, se)) in enumerate(data.items()):
        color = COLORS[i % len(COLORS)]
        band = np.isfinite(se)
        if band.sum() >= 2:
            overlay = Image.new("RGBA", img.size, (0, 0, 0, 0))
            up, lo = px(xs[band], ys[band] + se[band]), px(xs[band], ys[band] - se[band])
            poly = list(zip(up[0], up[1])) + list(zip(lo[0][::-1], lo[1][::-1]))
            ImageDraw.Draw(overlay).polygon([(float(a), float(b)) for a, b in poly], fill=(*color, 60))
            img = Image.alpha_composite(img, overlay)
        draw = ImageDraw.Draw(img)
        cx, cy = px(xs, ys)
        pts = [(float(a), float(b)) for a, b in zip(cx, cy)]
        if len(pts) > 1:
            draw.line(pts, fill=color, width=2)
        for a, b in pts:
            draw.ellipse((a - 3, b - 3, a + 3, b + 3), fill=color)
        ly = box[1] + 6 + i * (lh + 4)
        draw.line([(box[0] + 8, ly + lh / 2), (box[0] + 28, ly + lh / 2)], fill=color, width=3)
        draw.text((box[0] + 34, ly), name, fill=(0, 0, 0), font=fnt)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_png(np.asarray(img.convert("RGB")), out)


def _axes(draw, box, xr, yr, fnt, lh, title: str, xlabel: str) -> None:
    """Frame, title, x label and TICKS evenly spaced tick labels on each axis."""
    draw.rectangle(box, outline=(120, 120, 120))
    draw.text((box[0], (box[1] - lh) / 2), title, fill=(0, 0, 0), font=fnt)
    draw.text(((box[0] + box[2]) / 2 - draw.textlength(xlabel, font=fnt) / 2, box[3] + lh + 8), xlabel,
              fill=(0, 0, 0), font=fnt)
    for k in range(TICKS):
        f = k / (TICKS - 1)
        xv, yv = xr[0] + f * (xr[1] - xr[0]), yr[0] + f * (yr[1] - yr[0])
        xp, yp = box[0] + f * (box[2] - box[0]), box[3] - f * (box[3] - box[1])
        draw.line([(xp, box[3]), (xp, box[3] + 4)], fill=(120, 120, 120))
        draw.line([(box[0] - 4, yp), (box[0], yp)], fill=(120, 120, 120))
        label = f"{xv:,.0f}" if abs(xr[1]) >= 100 else f"{xv:.3g}"
        draw.text((xp - draw.textlength(label, font=fnt) / 2, box[3] + 6), label, fill=(60, 60, 60), font=fnt)
        ylab = f"{yv:.3f}"
        draw.text((box[0] - 8 - draw.textlength(ylab, font=fnt), yp - lh / 2), ylab, fill=(60, 60, 60), font=fnt)
