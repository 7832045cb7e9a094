"""Benchmark plots drawn with PIL (no plotting library in the environment).

Learning curves of several methods in one PNG: per method the mean over seeds as a line with markers and
mean ± standard error as a translucent band.

    plot_curves({"grpo": agg_grpo, "nft": agg_nft}, "curves_strict.png", metric="strict", x="rollout_nfe")

``agg_*`` are ``_learning_lib.aggregate`` results (``curve`` points with ``<x>_mean``, ``<metric>_mean`` and
``<metric>_se``); a missing SE (one seed) draws no band.

The balancer benchmark's reward-space scatter, one panel per pair of a set's rewards:

    plot_reward_space(summary["sets"]["count_vs_ink"], "balancers_count_vs_ink.png")

Each method is a point at its seed-mean held-out reward values after training with its 95 % t-interval over
seeds as error bars on both axes; the weighted-sum sweep points are grey and labelled with their weights, the
balancers coloured and named, the base checkpoint a black cross.
"""
from __future__ import annotations

import itertools
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


def _to_pixels(box, xr, yr):
    """The map (data x, data y) → (pixel x, pixel y) of the plot area ``box`` over the ranges ``xr``, ``yr``."""
    def px(xs, ys):
        return (box[0] + (xs - xr[0]) / (xr[1] - xr[0]) * (box[2] - box[0]),
                box[3] - (ys - yr[0]) / (yr[1] - yr[0]) * (box[3] - box[1]))
    return px


def _save(img: Image.Image, path: str | Path) -> Path:
    """Write ``img`` as a PNG at ``path`` (parents created) and return the path written."""
    from flowrl.eval.media import save_png

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_png(np.asarray(img.convert("RGB")), out)


def plot_curves(methods: dict, path: str | Path, metric: str = "strict", x: str = "rollout_nfe") -> Path:
    """Write the PNG to ``path`` (parents created) and return it; ``methods``: name → ``aggregate`` result."""
    from flowrl.eval.grid import font, line_height

    if not methods:
        raise ValueError("plot_curves: no methods given")
    data = {name: series(agg, metric, x) for name, agg in methods.items()}
    xr = _range([d[0] for d in data.values()], pad=0.0)
    yr = _range([d[1] + np.nan_to_num(d[2]) for d in data.values()] + [d[1] - np.nan_to_num(d[2])
                                                                        for d in data.values()])
    box = (LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM)
    px = _to_pixels(box, xr, yr)

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
    return _save(img, path)


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


# ------------------------------------------------------------------------------ reward-space scatter
PANEL = 420                                   # a scatter panel is PANEL × PANEL pixels, margins as above
SWEEP = (150, 150, 150)
BALANCER_COLORS = ((214, 39, 40), (31, 119, 180), (44, 160, 44), (255, 127, 14), (148, 103, 189))


def points(summary: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """method → (seed-mean after values, 95 % half-widths; 0 where a one-seed run has none), complete methods."""
    out = {}
    for name, m in summary["methods"].items():
        if None in m["point"]:
            continue
        ci = [m["gain"][r]["ci95"] or 0.0 for r in summary["rewards"]]
        out[name] = (np.asarray(m["point"], dtype=float), np.asarray(ci, dtype=float))
    return out


def _label(name: str, summary: dict) -> str:
    """A sweep point's label: its own ``label``, else its weights, ws(w_1,…,w_K)."""
    m = summary["methods"][name]
    return m.get("label") or "ws(" + ",".join(f"{w:g}" for w in m["weights"]) + ")"


def _panel(img, pts: dict, summary: dict, i: int, j: int, origin: tuple[int, int]) -> None:
    """Reward i on x, reward j on y, inside the panel whose top-left corner is ``origin``."""
    from flowrl.eval.grid import font, line_height

    base = summary["base"]
    box = (origin[0] + LEFT, origin[1] + TOP, origin[0] + PANEL - RIGHT, origin[1] + PANEL - BOTTOM)
    xr = _range([np.asarray([base[i]])] + [np.asarray([p[i] - c[i], p[i] + c[i]]) for p, c in pts.values()])
    yr = _range([np.asarray([base[j]])] + [np.asarray([p[j] - c[j], p[j] + c[j]]) for p, c in pts.values()])
    px = _to_pixels(box, xr, yr)

    draw, fnt = ImageDraw.Draw(img), font()
    lh = line_height(fnt)
    rewards = summary["rewards"]
    _axes(draw, box, xr, yr, fnt, lh, f"{rewards[j]} vs {rewards[i]}", rewards[i])
    bx, by = px(base[i], base[j])
    draw.line([(bx - 6, by - 6), (bx + 6, by + 6)], fill=(0, 0, 0), width=2)
    draw.line([(bx - 6, by + 6), (bx + 6, by - 6)], fill=(0, 0, 0), width=2)
    colors = {name: SWEEP for name in pts if "weights" in summary["methods"][name]}
    balancers = [name for name in pts if name not in colors]
    colors |= {name: BALANCER_COLORS[k % len(BALANCER_COLORS)] for k, name in enumerate(balancers)}
    for name, (p, c) in pts.items():
        color = colors[name]
        x, y = px(p[i], p[j])
        x0, _ = px(p[i] - c[i], p[j])
        x1, _ = px(p[i] + c[i], p[j])
        _, y0 = px(p[i], p[j] - c[j])
        _, y1 = px(p[i], p[j] + c[j])
        draw.line([(x0, y), (x1, y)], fill=color, width=1)
        draw.line([(x, y0), (x, y1)], fill=color, width=1)
        draw.ellipse((x - 4, y - 4, x + 4, y + 4), fill=color)
        if color == SWEEP:
            text = _label(name, summary)
            tx = x + 6 if x < (box[0] + box[2]) / 2 else x - 6 - draw.textlength(text, font=fnt)
            draw.text((tx, y - lh), text, fill=(110, 110, 110), font=fnt)
    for k, name in enumerate(["base (x)", *balancers]):
        draw.text((box[0] + 8, box[1] + 6 + k * (lh + 2)), name, fill=colors.get(name, (0, 0, 0)), font=fnt)


def plot_reward_space(summary: dict, path: str | Path) -> Path:
    """Write the set's scatter (one panel per reward pair) to ``path`` (parents created) and return it."""
    pts = points(summary)
    if not pts or None in summary["base"]:
        raise ValueError("plot_reward_space: no method with a complete point")
    pairs = list(itertools.combinations(range(len(summary["rewards"])), 2))
    img = Image.new("RGB", (PANEL * len(pairs), PANEL), (255, 255, 255))
    for k, (i, j) in enumerate(pairs):
        _panel(img, pts, summary, i, j, (k * PANEL, 0))
    return _save(img, path)
