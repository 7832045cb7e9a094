"""Training curves from ``metrics.jsonl`` drawn with matplotlib (the ``plots`` extra): one panel per metric.

    plot_run("runs/x")                       # → runs/x/curves.png: reward/*/mean, eval/*/mean, loss/* panels
    plot_run("runs/x", required=False)       # → None, with one log line, where matplotlib is not installed
    plot_metrics([rec...], ["loss/ratio"])   # → uint8 (H, W, 3) canvas

Each panel plots value against step; NaN / null values break the line (a reward that does not apply is not drawn
as zero) and a point standing alone between gaps is drawn as a dot. matplotlib is imported only when a figure is
drawn (Agg backend, no display), so training and evaluation never need it. ``figure`` / ``render`` are the
helpers every figure of the package (the benchmark lab's too) is drawn with.
"""
from __future__ import annotations

import fnmatch
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["DEFAULT_PATTERNS", "figure", "line_panel", "plot_metrics", "plot_run", "render", "series"]

DEFAULT_PATTERNS = ("reward/*/mean", "eval/*/mean", "adv/zero_std_frac", "loss/*", "train/grad_norm")
LINE_COLOR = (31, 119, 180)
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 56, 10, 8, 8
DPI = 100
FONT_SIZE = 8
MISSING = "matplotlib is not installed (pip install 'flowrl[plots]')"


def rgb(color: tuple[int, int, int]) -> tuple[float, float, float]:
    """An 8-bit RGB colour as matplotlib's 0–1 floats."""
    return tuple(c / 255 for c in color)


def figure(width: int, height: int):
    """A matplotlib ``Figure`` of exactly ``width`` × ``height`` pixels on the Agg canvas (no pyplot, no display).
    Raises ImportError naming the ``plots`` extra when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(f"{MISSING}: it draws the plots") from e
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, facecolor="white")
    FigureCanvasAgg(fig)
    return fig


def render(fig) -> np.ndarray:
    """The figure's pixels, uint8 (H, W, 3) on white."""
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


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
    """Data → pixel coordinates inside ``box`` = (left, top, right, bottom); y grows upwards (the panel's map)."""
    left, top, right, bottom = box
    px = left + (xs - xr[0]) / (xr[1] - xr[0]) * (right - left)
    py = bottom - (ys - yr[0]) / (yr[1] - yr[0]) * (bottom - top)
    return np.stack([px, py], axis=-1)


def line_panel(xs: np.ndarray, ys: np.ndarray, title: str, width: int = 360, height: int = 200) -> np.ndarray:
    """One chart: title, frame, value and step ticks, the line (NaN breaks it) → uint8 (height, width, 3)."""
    fig = figure(width, height)
    lh = 2 * FONT_SIZE
    ax = fig.add_axes((MARGIN_LEFT / width, (MARGIN_BOTTOM + lh) / height,
                       (width - MARGIN_LEFT - MARGIN_RIGHT) / width, (height - MARGIN_TOP - 2 * lh - MARGIN_BOTTOM)
                       / height))
    ax.set_title(title, fontsize=FONT_SIZE, loc="left", pad=3)
    ax.tick_params(labelsize=FONT_SIZE - 1, length=2, pad=1, colors=(0.24, 0.24, 0.24))
    for spine in ax.spines.values():
        spine.set_color((0.6, 0.6, 0.6))
    ok = np.isfinite(ys)
    if xs.size and ok.any():
        ax.set_xlim(*_span(float(xs.min()), float(xs.max())))
        ax.set_ylim(*_span(float(ys[ok].min()), float(ys[ok].max())))
        ax.plot(xs, ys, color=rgb(LINE_COLOR), linewidth=2.0, solid_capstyle="round")
        alone = ok & ~np.convolve(ok, [1, 0, 1], mode="same").astype(bool)     # no finite neighbour
        if alone.any():
            ax.plot(xs[alone], ys[alone], "o", color=rgb(LINE_COLOR), markersize=3.5)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.02, 0.95, "no finite values", transform=ax.transAxes, va="top", fontsize=FONT_SIZE,
                color=(0.47, 0.47, 0.47))
    return render(fig)


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


def plot_run(run_dir: str | Path, patterns: Sequence[str] = DEFAULT_PATTERNS, out: str | Path | None = None,
             required: bool = True) -> Path | None:
    """Write the curves of ``run_dir/metrics.jsonl`` matching ``patterns`` to ``out`` (default run_dir/curves.png).
    ``required=False`` (a trainer's or evaluator's optional plot): without matplotlib, log one line and return
    None instead of raising."""
    from flowrl.eval.media import save_png
    from flowrl.training.metrics_log import read_metrics

    target = Path(out) if out is not None else Path(run_dir) / "curves.png"
    records = read_metrics(run_dir)
    names = matching_names(records, patterns)
    try:
        canvas = plot_metrics(records, names)
    except ImportError:
        if required:
            raise
        print(f"[flowrl] {MISSING}; skipped the training-curve plot {target}", file=sys.stderr)
        return None
    return save_png(canvas, target)
