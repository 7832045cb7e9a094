"""Training curves (matplotlib): the linear map, NaN breaks the line, layout and errors; without matplotlib the
optional plot is skipped with one log line, a required one raises naming the ``plots`` extra."""
from __future__ import annotations

import json
import sys

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


MATPLOTLIB = ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg")


def no_matplotlib(monkeypatch):
    """Make every matplotlib import fail, as on an install without the ``plots`` extra."""
    for name in MATPLOTLIB:
        monkeypatch.setitem(sys.modules, name, None)


def _curves_dir(tmp_path):
    recs = [{"step": s, "time": 0, "loss/ratio": 1.0 + s} for s in range(3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return tmp_path


def test_plot_run_writes_a_png_drawn_by_matplotlib(tmp_path, monkeypatch):
    path = plot_run(_curves_dir(tmp_path))
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == (360, 200)
        img.verify()
    no_matplotlib(monkeypatch)                     # the same call without matplotlib cannot draw: it is what draws
    with pytest.raises(ImportError, match=r"flowrl\[plots\]"):
        plot_run(tmp_path, out=tmp_path / "again.png")


def test_optional_plot_is_skipped_with_one_line_without_matplotlib(tmp_path, monkeypatch, capsys):
    no_matplotlib(monkeypatch)
    assert plot_run(_curves_dir(tmp_path), required=False) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matplotlib is not installed" in err[0] and "curves.png" in err[0]
    assert not (tmp_path / "curves.png").exists()


def test_flowrl_imports_matplotlib_only_lazily():
    """Training never needs matplotlib: no module of the package imports it at module level."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "flowrl"
    bad = [str(p) for p in root.rglob("*.py")
           for node in ast.parse(p.read_text()).body
           if isinstance(node, (ast.Import, ast.ImportFrom))
           and any((getattr(node, "module", None) or a.name).split(".")[0] == "matplotlib" for a in node.names)]
    assert not bad, f"import matplotlib inside the drawing function: {bad}"
