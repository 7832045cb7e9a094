"""``scripts/bench.py regime``: the default job's figures are read from a run's metrics.jsonl as the bench says."""
import json

import pytest

from flowrl.bench.benchmarks import regime


def write_run(run_dir, before: dict, after: dict):
    (run_dir / "eval").mkdir(parents=True)
    (run_dir / "eval" / "before_after.png").write_bytes(b"png")
    lines = [{"step": 0, **before}, {"step": 5, "loss": 1.0}, {"step": 60, **after}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_job_figures_are_after_minus_before_and_after_over_before(tmp_path):
    write_run(tmp_path, {"eval/shapes/strict/mean": 0.25, "eval/palette_distance/mean": 0.02},
              {"eval/shapes/strict/mean": 0.35, "eval/palette_distance/mean": 0.025,
               "eval/alarm/palette_distance": 1.0, "eval/alarm/diversity": 0.0})
    f = regime.job_figures(tmp_path)
    assert f["gain"] == pytest.approx(0.10) and f["palette_ratio"] == pytest.approx(1.25)
    assert f["alarms"] == ["palette_distance"] and f["before_after_png"]


def test_a_run_without_both_evaluations_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/shapes/strict/mean": 0.2}) + "\n")
    with pytest.raises(RuntimeError, match="not before and after"):
        regime.job_figures(tmp_path)


def test_mean_se_over_seeds():
    m, se = regime.mean_se([0.1, 0.2, 0.3])
    assert m == pytest.approx(0.2) and se == pytest.approx(0.1 / 3 ** 0.5)
    assert regime.mean_se([0.4]) == (0.4, None)
