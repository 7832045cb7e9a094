"""flowrl.training.metrics_log: jsonl records, TensorBoard events, rank-0 only, name and value checks, resume
trimming."""
from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from flowrl.training.metrics_log import MetricsLogger, read_metrics, summarize


def test_jsonl_records_and_tensorboard(tmp_path):
    with MetricsLogger(tmp_path) as log:
        log.log({"reward/shapes/mean": torch.tensor(0.5), "loss/ratio": 1.0, "adv/zero_std_frac": 0}, step=1)
        log.log({"eval/shapes/mean": float("nan"), "loss/ratio": torch.tensor([2.0])}, step=2)
    recs = read_metrics(tmp_path)
    assert [r["step"] for r in recs] == [1, 2]
    assert recs[0]["reward/shapes/mean"] == 0.5 and recs[0]["adv/zero_std_frac"] == 0
    assert recs[1]["eval/shapes/mean"] is None and recs[1]["loss/ratio"] == 2.0
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        json.loads(line)  # strict JSON (no NaN tokens)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss/ratio")] == [(1, 1.0), (2, 2.0)]


def test_non_main_process_writes_nothing(tmp_path):
    log = MetricsLogger(tmp_path / "run", is_main_process=False, wandb=True)  # wandb never imported either
    assert log.log({"loss/ratio": 1.0}, step=0) is None
    log.log_images("eval/grid", torch.zeros(1, 3, 4, 4), step=0)
    log.close()
    assert not (tmp_path / "run").exists()


def test_bad_names_and_values_are_explained(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        with pytest.raises(ValueError, match="not namespaced"):
            log.log({"ratio": 1.0}, step=0)
        with pytest.raises(ValueError, match="is not a scalar"):
            log.log({"loss/ratio": torch.ones(3)}, step=0)
        with pytest.raises(ValueError, match="not a number"):
            log.log({"loss/ratio": "high"}, step=0)


def test_resume_drops_records_after_the_checkpoint(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        for s in range(6):
            log.log({"loss/total": s}, step=s)
    with MetricsLogger(tmp_path, tensorboard=False, resume_step=3) as log:
        log.log({"loss/total": 40}, step=4)
    assert [(r["step"], r["loss/total"]) for r in read_metrics(tmp_path)] == [(0, 0), (1, 1), (2, 2), (3, 3),
                                                                               (4, 40)]


def test_wandb_missing_gives_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb → ImportError
    with pytest.raises(ImportError, match="pip install 'flowrl\\[wandb\\]'"):
        MetricsLogger(tmp_path, tensorboard=False, wandb=True)


def test_wandb_receives_scalars(tmp_path, monkeypatch):
    calls = []

    class FakeRun:
        def log(self, d, step):
            calls.append((d, step))

        def finish(self):
            calls.append("finish")

    class FakeWandb:
        @staticmethod
        def init(**kw):
            calls.append(kw["project"])
            return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", FakeWandb)
    with MetricsLogger(tmp_path, tensorboard=False, wandb=True, wandb_project="p") as log:
        log.log({"loss/ratio": 1.5, "eval/x/mean": float("inf")}, step=3)
    assert calls == ["p", ({"loss/ratio": 1.5}, 3), "finish"]


def test_summarize_ignores_nan():
    s = summarize("reward/ocr", torch.tensor([1.0, float("nan"), 3.0, float("nan")]))
    assert s["reward/ocr/mean"] == 2.0 and s["reward/ocr/std"] == 1.0
    assert (s["reward/ocr/min"], s["reward/ocr/max"], s["reward/ocr/nan_frac"]) == (1.0, 3.0, 0.5)
    empty = summarize("reward/ocr", torch.tensor([float("nan")]))
    assert math.isnan(empty["reward/ocr/mean"]) and empty["reward/ocr/nan_frac"] == 1.0


def test_log_images_to_tensorboard(tmp_path):
    with MetricsLogger(tmp_path) as log:
        log.log_images("eval/samples", torch.rand(2, 3, 8, 8), step=5)
        with pytest.raises(ValueError, match=r"expected \(B, 3, H, W\)"):
            log.log_images("eval/samples", torch.rand(3, 8, 8), step=5)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Images("eval/samples")] == [5]
