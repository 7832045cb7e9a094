"""Metric logging: ``metrics.jsonl`` in the run dir (always), TensorBoard (default), wandb (when asked).

One JSON object per ``log`` call: ``{"step": n, "time": t, "<namespace>/<name>": value, ...}``. Names are
stable and namespaced (see docs/evaluation.md for the table), e.g. ``reward/<name>/mean``, ``loss/ratio``,
``adv/zero_std_frac``, ``eval/<reward>/mean``. Non-finite values are written as ``null`` (valid JSON).

Under accelerate only rank 0 writes: pass ``is_main_process=accelerator.is_main_process``; on other ranks
every method is a no-op and nothing is created. The anchors log to wandb only and keep no local record
(flow_grpo ``scripts/train_sd3.py``: ``wandb.init`` only); the jsonl file is what plots and tests read.
"""
from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["METRICS_FILE", "MetricsLogger", "read_metrics", "summarize"]

METRICS_FILE = "metrics.jsonl"
_NAME = re.compile(r"^[A-Za-z0-9_]+(/[A-Za-z0-9_.\-]+)+$")


def _scalar(name: str, value: Any) -> float | int | None:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"metric {name!r}: tensor of shape {tuple(value.shape)} is not a scalar; "
                             "log its mean (or use flowrl.training.metrics_log.summarize)")
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"metric {name!r}: value {value!r} of type {type(value).__name__} is not a number") from None
    return value if math.isfinite(value) else None


def check_metric_name(name: str) -> None:
    """Names are ``namespace/name[/...]`` of letters, digits, ``_ . -`` (e.g. ``reward/pickscore/mean``)."""
    if not _NAME.match(name):
        raise ValueError(f"metric name {name!r} is not namespaced: use 'namespace/name', e.g. 'loss/ratio' or "
                         "'reward/<name>/mean' (letters, digits, '_', '.', '-'; at least one '/')")


def summarize(prefix: str, values: Tensor) -> dict[str, float]:
    """``{prefix/mean, prefix/std, prefix/min, prefix/max, prefix/nan_frac}`` of a 1-D tensor, NaNs ignored
    (NaN = "does not apply", DESIGN conventions); std is the population std (unbiased=False)."""
    v = values.detach().float().flatten().cpu()
    ok = v[~torch.isnan(v)]
    nan_frac = 1.0 - ok.numel() / max(v.numel(), 1)
    if ok.numel() == 0:
        stats = dict.fromkeys(("mean", "std", "min", "max"), float("nan"))
    else:
        stats = {"mean": ok.mean().item(), "std": ok.std(unbiased=False).item(),
                 "min": ok.min().item(), "max": ok.max().item()}
    stats["nan_frac"] = nan_frac
    return {f"{prefix}/{k}": val for k, val in stats.items()}


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a ``metrics.jsonl`` file (or of ``<run_dir>/metrics.jsonl``)."""
    p = Path(path)
    if p.is_dir():
        p = p / METRICS_FILE
    with open(p) as f:
        return [json.loads(line) for line in f if line.strip()]


class MetricsLogger:
    """Writes scalar metrics to ``run_dir/metrics.jsonl`` (+ TensorBoard under ``run_dir/tb``, + wandb).

    resume_step: when resuming from a checkpoint at this step, records with a larger step (logged after the
        checkpoint by the run that crashed) are dropped from metrics.jsonl so the file has no duplicates.
    """

    def __init__(self, run_dir: str | Path, is_main_process: bool = True, tensorboard: bool = True,
                 wandb: bool = False, wandb_project: str = "flowrl", run_name: str | None = None,
                 config: Mapping | None = None, resume_step: int | None = None):
        self.enabled = is_main_process
        self.run_dir = Path(run_dir)
        self._tb = self._wandb = self._file = None
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / METRICS_FILE
        if resume_step is not None and path.exists():
            kept = [r for r in read_metrics(path) if r.get("step", -1) <= resume_step]
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self._file = open(path, "a")  # noqa: SIM115  (kept open for the run; closed in close())
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"))
        if wandb:
            self._wandb = _init_wandb(wandb_project, run_name or self.run_dir.name, self.run_dir, config)

    def log(self, metrics: Mapping[str, Any], step: int) -> dict | None:
        """Write one record; returns it (None on non-main processes). Tensors must be scalars."""
        if not self.enabled:
            return None
        record: dict[str, Any] = {"step": int(step), "time": round(time.time(), 3)}
        for name, value in metrics.items():
            check_metric_name(name)
            record[name] = _scalar(name, value)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        scalars = {k: v for k, v in record.items() if k not in ("step", "time") and v is not None}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, global_step=step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        return record

    def log_images(self, tag: str, images: Tensor, step: int, captions: list[str] | None = None) -> None:
        """Images (B, 3, H, W) in [0, 1] to TensorBoard / wandb (the jsonl file holds scalars only)."""
        if not self.enabled:
            return
        check_metric_name(tag)
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"log_images({tag!r}): expected (B, 3, H, W) in [0, 1], got {tuple(images.shape)}")
        images = images.detach().float().clamp(0, 1).cpu()
        if self._tb is not None:
            self._tb.add_images(tag, images, global_step=step)
        if self._wandb is not None:
            import wandb

            caps = captions or [None] * len(images)
            self._wandb.log({tag: [wandb.Image(im.permute(1, 2, 0).numpy(), caption=c)
                                   for im, c in zip(images, caps)]}, step=step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _init_wandb(project: str, name: str, run_dir: Path, config: Mapping | None):
    try:
        import wandb
    except ImportError as e:
        raise ImportError("wandb logging was requested (log.wandb=true) but wandb is not installed: "
                          "pip install 'flowrl[wandb]', or set log.wandb=false") from e
    return wandb.init(project=project, name=name, dir=str(run_dir), config=dict(config or {}),
                      id=name, resume="allow")
