"""Benchmark plots drawn with matplotlib (the ``plots`` extra; Agg backend, no display).

Learning curves of several methods in one PNG: per method the mean over seeds as a line with markers and
mean ± standard error as a translucent band.

    plot_curves({"grpo": agg_grpo, "nft": agg_nft}, "curves_strict.png", metric="strict", x="rollout_nfe")

``agg_*`` are ``learning_lib.aggregate`` results (``curve`` points with ``<x>_mean``, ``<metric>_mean`` and
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

from flowrl.eval.plots import figure, render, rgb

COLORS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189), (140, 86, 75),
          (227, 119, 194), (127, 127, 127))
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 760, 460, 70, 20, 36, 48
FONT_SIZE = 8
BAND_ALPHA = 60 / 255                       # the ± SE band over white


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


def _save(pixels: np.ndarray, path: str | Path) -> Path:
    """Write the RGB pixels as a PNG at ``path`` (parents created) and return the path written."""
    from flowrl.eval.media import save_png

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_png(pixels, out)


def _axes(fig, box: tuple[float, float, float, float], xr, yr, title: str, xlabel: str):
    """Axes over the pixel box (left, top, right, bottom) of the figure, with its ranges, title and x label."""
    w, h = fig.bbox.width, fig.bbox.height
    ax = fig.add_axes((box[0] / w, 1 - box[3] / h, (box[2] - box[0]) / w, (box[3] - box[1]) / h))
    ax.set_xlim(*xr)
    ax.set_ylim(*yr)
    ax.set_title(title, fontsize=FONT_SIZE + 1, loc="left")
    ax.set_xlabel(xlabel, fontsize=FONT_SIZE + 1, labelpad=2)
    ax.tick_params(labelsize=FONT_SIZE, colors=(0.24, 0.24, 0.24))
    for spine in ax.spines.values():
        spine.set_color((0.47, 0.47, 0.47))
    if abs(xr[1]) >= 100:
        ax.xaxis.set_major_formatter("{x:,.0f}")
    return ax


def plot_curves(methods: dict, path: str | Path, metric: str = "strict", x: str = "rollout_nfe") -> Path:
    """Write the PNG to ``path`` (parents created) and return it; ``methods``: name → ``aggregate`` result."""
    if not methods:
        raise ValueError("plot_curves: no methods given")
    data = {name: series(agg, metric, x) for name, agg in methods.items()}
    xr = _range([d[0] for d in data.values()], pad=0.0)
    yr = _range([d[1] + np.nan_to_num(d[2]) for d in data.values()] + [d[1] - np.nan_to_num(d[2])
                                                                        for d in data.values()])
    fig = figure(WIDTH, HEIGHT)
    ax = _axes(fig, (LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM), xr, yr,
               f"{metric} vs {x} (mean ± SE over seeds)", x)
    for i, (name, (xs, ys, se)) in enumerate(data.items()):
        color = rgb(COLORS[i % len(COLORS)])
        band = np.isfinite(se)
        if band.sum() >= 2:
            ax.fill_between(xs[band], ys[band] - se[band], ys[band] + se[band], color=color, alpha=BAND_ALPHA,
                            linewidth=0)
        ax.plot(xs, ys, color=color, linewidth=2.0, marker="o", markersize=4.5, label=name)
    ax.legend(loc="best", fontsize=FONT_SIZE + 1, frameon=False, handlelength=1.6)
    return _save(render(fig), path)


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


def _panel(fig, pts: dict, summary: dict, i: int, j: int, origin: int) -> None:
    """Reward i on x, reward j on y, inside the panel whose left edge is at pixel ``origin``."""
    base = summary["base"]
    xr = _range([np.asarray([base[i]])] + [np.asarray([p[i] - c[i], p[i] + c[i]]) for p, c in pts.values()])
    yr = _range([np.asarray([base[j]])] + [np.asarray([p[j] - c[j], p[j] + c[j]]) for p, c in pts.values()])
    rewards = summary["rewards"]
    ax = _axes(fig, (origin + LEFT, TOP, origin + PANEL - RIGHT, PANEL - BOTTOM), xr, yr,
               f"{rewards[j]} vs {rewards[i]}", rewards[i])
    ax.plot([base[i]], [base[j]], "x", color="black", markersize=8, markeredgewidth=2, label="base (x)",
            linestyle="none")
    colors = {name: SWEEP for name in pts if "weights" in summary["methods"][name]}
    balancers = [name for name in pts if name not in colors]
    colors |= {name: BALANCER_COLORS[k % len(BALANCER_COLORS)] for k, name in enumerate(balancers)}
    mid = (xr[0] + xr[1]) / 2
    for name, (p, c) in pts.items():
        color = rgb(colors[name])
        ax.errorbar([p[i]], [p[j]], xerr=[c[i]], yerr=[c[j]], fmt="o", color=color, markersize=6.5,
                    elinewidth=1, capsize=0, label=None if colors[name] == SWEEP else name)
        if colors[name] == SWEEP:
            left = p[i] < mid
            ax.annotate(_label(name, summary), (p[i], p[j]), xytext=(6 if left else -6, 4),
                        textcoords="offset pixels", ha="left" if left else "right", va="bottom",
                        fontsize=FONT_SIZE, color=(0.43, 0.43, 0.43))
    ax.legend(loc="best", fontsize=FONT_SIZE, frameon=False, handlelength=1.0, labelspacing=0.3)


def plot_reward_space(summary: dict, path: str | Path) -> Path:
    """Write the set's scatter (one panel per reward pair) to ``path`` (parents created) and return it."""
    pts = points(summary)
    if not pts or None in summary["base"]:
        raise ValueError("plot_reward_space: no method with a complete point")
    pairs = list(itertools.combinations(range(len(summary["rewards"])), 2))
    fig = figure(PANEL * len(pairs), PANEL)
    for k, (i, j) in enumerate(pairs):
        _panel(fig, pts, summary, i, j, k * PANEL)
    return _save(render(fig), path)
