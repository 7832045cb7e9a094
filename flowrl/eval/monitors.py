"""The hacking monitors as ``run_eval`` wires them: which image statistics to score, their per-sample values,
the samples kept for seed diversity, and the drift alarms against a base reference.

Definitions live in ``detectors`` (image statistics), ``diversity`` (seed diversity) and ``drift`` (bands);
this module only connects them to the evaluation's samples and summary names.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import torch
from torch import Tensor

from flowrl.eval.detectors import image_statistics
from flowrl.eval.diversity import downsample, prompt_diversity
from flowrl.eval.drift import DriftBand, alarm_metrics, drift_checks

__all__ = ["COUNT_KEYS", "DETECTORS", "DiversitySamples", "detector_kind", "detector_scores", "evaluation_alarms",
           "policy_summary"]

DETECTORS = ("auto", "images", "shapes", None)  # run_eval(detectors=...): which image statistics to compute
COUNT_KEYS = ("eval/num_prompts", "eval/num_seeds")  # one value per evaluation, whatever the policies


def detector_kind(detectors: str | None, metas: Sequence, num_frames: int | None) -> str | None:
    """Resolve run_eval's ``detectors``: "auto" → "shapes" when every prompt carries shapes-world metadata
    (``skill`` and ``objects``) and the policy makes images, else "images"."""
    if detectors not in DETECTORS:
        raise ValueError(f"run_eval: detectors {detectors!r}; choose one of {DETECTORS}")
    if detectors != "auto":
        return detectors
    shapes = num_frames is None and all(isinstance(m, Mapping) and "skill" in m and "objects" in m for m in metas)
    return "shapes" if shapes else "images"


def detector_scores(pixels: Tensor, shapes_world: bool, skip: Collection[str] = ()) -> dict[str, Tensor]:
    """``detect/<statistic>`` (n,) on the CPU of decoded pixels (n, 3, H, W), or (n, F, 3, H, W) (mean over
    frames). A statistic named in ``skip`` (a scorer already computes it under that name: the shapes prompt
    set's ``palette_distance``) is left to that scorer, so each figure has one owner."""
    frames = pixels.reshape(-1, *pixels.shape[-3:]).clamp(0, 1)
    stats = image_statistics(frames, shapes_world, skip=skip)
    return {f"detect/{k}": v.reshape(pixels.shape[0], -1).mean(1).cpu() for k, v in stats.items()}


class DiversitySamples:
    """Keeps each sample downsampled (``diversity.downsample``) as ``generate`` produces it (its ``on_sample``
    callback), then gives the per-prompt seed diversity."""

    def __init__(self):
        self.small: dict[tuple[int, int], Tensor] = {}

    def __call__(self, prompt_idx: int, seed: int, pixels: Tensor, scores: dict) -> None:
        self.small[(prompt_idx, seed)] = downsample(pixels.detach().float().cpu()[None])[0]

    def per_prompt(self) -> dict[int, float]:
        if not self.small:
            return {}
        return prompt_diversity(torch.stack(list(self.small.values())), [p for p, _ in self.small], size=None)


def policy_summary(summary: Mapping[str, float], label: str) -> dict[str, float]:
    """One policy's part of a several-policy summary, named as a one-policy summary (``eval/<label>/x`` →
    ``eval/x``, plus ``eval/num_prompts`` and ``eval/num_seeds``): a base reference for drift alarms."""
    prefix = f"eval/{label}/"
    out = {f"eval/{k[len(prefix):]}": v for k, v in summary.items() if k.startswith(prefix)}
    out.update({k: summary[k] for k in COUNT_KEYS if k in summary})
    return out


def evaluation_alarms(summary: Mapping[str, float], labels: Sequence[str], base_stats: Mapping[str, float] | None,
                      bands: Mapping[str, DriftBand] | None) -> tuple[dict[str, float], list[str] | None]:
    """(``eval/[<label>/]alarm/<statistic>`` 0/1, one line per alarm for the gallery; None when there is no
    reference). Reference: ``base_stats``, else the "base" column when other policies are evaluated beside it."""
    compared = list(labels)
    if base_stats is None:
        if "base" not in labels or len(labels) < 2:
            return {}, None
        base_stats, compared = policy_summary(summary, "base"), [lab for lab in labels if lab != "base"]
    single = len(labels) == 1
    alarms, lines = {}, []
    for lab in compared:
        checks = drift_checks(base_stats, summary, bands, label=None if single else lab)
        alarms.update(alarm_metrics(checks, None if single else lab))
        lines += [f"{lab}: {c.describe()}" for c in checks if c.fired]
    return alarms, lines
