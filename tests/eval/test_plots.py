"""PIL training curves: points land where the linear map says, NaN breaks the line, layout and errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from flowrl.eval.plots import (
    LINE_COLOR,
    line_panel,
    matching_names,
    plot_metrics,
    plot_run,
    series,
    to_pixels,
)


def test_series_reads_steps_and_nulls():
    recs = [{"step": 0, "loss/total": 1.0}, {"step": 1}, {"step": 2, "loss/total": None}]
    xs, ys = series(recs, "loss/total")
    assert xs.tolist() == [0.0, 2.0] and ys[0] == 1.0 and np.isnan(ys[1])


def test_to_pixels_is_the_linear_map():
    pts = to_pixels(np.array([0.0, 10.0, 5.0]), np.array([1.0, 3.0, 2.0]), (10, 20, 110, 220), (0, 10), (1, 3))
    assert pts.tolist() == [[10, 220], [110, 20], [60, 120]]


def _line_pixels(panel):
    return np.argwhere((panel == LINE_COLOR).all(-1))


def test_panel_draws_the_line_and_nan_breaks_it():
    xs = np.arange(6, dtype=float)
    full = _line_pixels(line_panel(xs, xs.copy(), "t"))
    ys = xs.copy()
    ys[2:4] = np.nan  # points 0,1 and 4,5 remain: two short segments, no line across the gap
    gap = _line_pixels(line_panel(xs, ys, "t"))
    assert len(full) > len(gap) > 0
    mid_x = full[:, 1].min() + (full[:, 1].max() - full[:, 1].min()) // 2
    assert (full[:, 1] == mid_x).any() and not (gap[:, 1] == mid_x).any()
    rising = full[np.argsort(full[:, 1])]
    assert rising[0, 0] > rising[-1, 0]  # increasing values go up the image


def test_constant_and_empty_series_do_not_fail():
    assert _line_pixels(line_panel(np.arange(3.0), np.ones(3), "c")).size
    panel = line_panel(np.arange(2.0), np.full(2, np.nan), "all nan")
    assert panel.shape == (200, 360, 3) and not _line_pixels(panel).size


def test_plot_run_writes_curves(tmp_path):
    recs = [{"step": s, "time": 0, "reward/shapes/mean": s / 10, "loss/ratio": 1.0, "train/lr": 1e-4}
            for s in range(5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert matching_names(recs, ["reward/*/mean", "loss/*"]) == ["reward/shapes/mean", "loss/ratio"]
    img = np.asarray(Image.open(plot_run(tmp_path)))
    assert img.shape == (200, 2 * 360, 3)  # reward + loss panels; train/lr not in the default patterns
    assert plot_metrics(recs, ["loss/ratio"] * 4, columns=3).shape == (400, 3 * 360, 3)
    with pytest.raises(ValueError, match="no metric names"):
        plot_run(tmp_path, patterns=["nothing/*"])
