"""Drift alarms: a hacking statistic raises an alarm when an evaluation's mean leaves its band around the base
model's mean.

For statistic s with base mean m, base standard deviation σ over its n samples, and current mean x:

    SE  = σ / sqrt(n − 1)                       (standard error of the base mean; 0 when n is unknown or < 2)
    h   = max(k · SE, rel · |m|, abs_floor)     (the band's half-width)
    alarm  ⇔  x > m + h   (direction "up"),   x < m − h   ("down"),   |x − m| > h   ("both")

n is the number of images (prompts × seeds; the detector statistics and palette distance) or of prompts
(diversity), read from the base summary's ``eval/num_prompts`` and ``eval/num_seeds``. The three terms: k·SE keeps
sampling noise out (two evaluations of one model on the same prompts with different seeds differ by at most
about sqrt(2)·SE, since the prompt effect cancels, so k = 5 is ≥ 3.5 standard deviations of that difference);
rel·|m| ignores changes too small to matter when n is large (training is meant to change the images a little);
abs_floor covers statistics whose base value is ~0 with ~0 spread (e.g. no blown-out pixels at all). Directions
are those of the hacks each statistic exposes: images going dark or blown out (up), speckle or off-palette
colour (up), mode collapse (diversity down); edge density and colour entropy move both ways (speckle raises
them, flat or collapsed images lower them). Defaults and their calibration: docs/evaluation.md.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DEFAULT_BANDS", "DriftBand", "DriftCheck", "alarm_metrics", "drift_alarms", "drift_checks",
           "statistic_stem"]

_DIRECTIONS = ("up", "down", "both")
_UNITS = ("images", "prompts")


@dataclass(frozen=True)
class DriftBand:
    """The allowed region around a base value: half-width max(k_se·SE, rel·|base|, abs_floor), one- or
    two-sided (``direction``), SE from ``unit`` samples ("images" = prompts × seeds, "prompts")."""

    direction: str = "both"
    k_se: float = 5.0
    rel: float = 0.25
    abs_floor: float = 0.02
    unit: str = "images"

    def __post_init__(self):
        if self.direction not in _DIRECTIONS:
            raise ValueError(f"DriftBand.direction must be one of {_DIRECTIONS}, got {self.direction!r}")
        if self.unit not in _UNITS:
            raise ValueError(f"DriftBand.unit must be one of {_UNITS}, got {self.unit!r}")
        for name in ("k_se", "rel", "abs_floor"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"DriftBand.{name} must be a finite number >= 0, got {v}")

    def half_width(self, base: float, se: float) -> float:
        return max(self.k_se * se, self.rel * abs(base), self.abs_floor)

    def limits(self, base: float, se: float) -> tuple[float, float]:
        """(low, high): values outside raise the alarm (±inf on the side that never does)."""
        h = self.half_width(base, se)
        low = base - h if self.direction in ("down", "both") else -math.inf
        high = base + h if self.direction in ("up", "both") else math.inf
        return low, high


# Why these values (measured on the shipped toy model; docs/evaluation.md, "Hacking detectors and diversity"):
# seed-to-seed differences are ≤ 1/10 of every half-width; UniRL's measured hack (dark fraction ×2, edge density
# −60 %, colour entropy −54 %; UniRL PR #407) leaves every band; palette distance fires when it doubles (the
# β_KL 1e-4 toy run, 0.0129 → 0.0263) but not at the default recipe's 0.0229 (docs/training.md).
DEFAULT_BANDS: dict[str, DriftBand] = {
    "dark_frac": DriftBand("up", rel=0.5, abs_floor=0.05),
    "bright_frac": DriftBand("up", rel=0.5, abs_floor=0.05),
    "edge_density": DriftBand("both", rel=0.3, abs_floor=0.02),
    "color_entropy": DriftBand("both", rel=0.3, abs_floor=0.25),
    "palette_distance": DriftBand("up", rel=1.0, abs_floor=0.01),
    "stray_frac": DriftBand("up", rel=1.0, abs_floor=0.005),
    "diversity": DriftBand("down", rel=0.3, abs_floor=0.02, unit="prompts"),
}


@dataclass(frozen=True)
class DriftCheck:
    """One statistic compared with its band."""

    statistic: str
    base: float
    value: float
    low: float
    high: float

    @property
    def fired(self) -> bool:
        return math.isfinite(self.value) and not (self.low <= self.value <= self.high)

    def describe(self) -> str:
        where = "above" if self.value > self.high else "below" if self.value < self.low else "within"
        lo = "-inf" if math.isinf(self.low) else f"{self.low:.4g}"
        hi = "+inf" if math.isinf(self.high) else f"{self.high:.4g}"
        return f"{self.statistic} = {self.value:.4g} is {where} its band [{lo}, {hi}] (base {self.base:.4g})"


def statistic_stem(summary: Mapping[str, float], statistic: str, prefix: str = "eval/") -> str | None:
    """The summary name stem of a statistic: ``<prefix>detect/<s>`` (the image detectors), else ``<prefix><s>``
    (a figure owned elsewhere: ``palette_distance`` from the prompt set, ``diversity``); None when absent."""
    for stem in (f"{prefix}detect/{statistic}", f"{prefix}{statistic}"):
        if f"{stem}/mean" in summary:
            return stem
    return None


def _standard_error(base: Mapping[str, float], stem: str, unit: str) -> float:
    prompts, seeds = base.get("eval/num_prompts"), base.get("eval/num_seeds")
    std = base.get(f"{stem}/std")
    if prompts is None or seeds is None or std is None or not math.isfinite(std):
        return 0.0
    n = prompts * seeds if unit == "images" else prompts
    return std / math.sqrt(n - 1) if n >= 2 else 0.0


def drift_checks(base_stats: Mapping[str, float], current_stats: Mapping[str, float],
                 bands: Mapping[str, DriftBand] | None = None, *, label: str | None = None) -> list[DriftCheck]:
    """One DriftCheck per banded statistic present (finite) in both summaries.

    base_stats: a one-policy ``run_eval`` summary (``eval/<stem>/mean``, ``/std``, ``eval/num_prompts``,
    ``eval/num_seeds``), e.g. the "before" evaluation. current_stats: a ``run_eval`` summary, read under
    ``eval/<label>/`` when ``label`` is given (several policies), else ``eval/``."""
    bands = DEFAULT_BANDS if bands is None else bands
    prefix = "eval/" if label is None else f"eval/{label}/"
    checks = []
    for name, band in bands.items():
        base_stem, cur_stem = statistic_stem(base_stats, name), statistic_stem(current_stats, name, prefix)
        if base_stem is None or cur_stem is None:
            continue
        base, value = base_stats[f"{base_stem}/mean"], current_stats[f"{cur_stem}/mean"]
        if not (math.isfinite(base) and math.isfinite(value)):
            continue
        low, high = band.limits(base, _standard_error(base_stats, base_stem, band.unit))
        checks.append(DriftCheck(name, base, value, low, high))
    return checks


def alarm_metrics(checks: list[DriftCheck], label: str | None = None) -> dict[str, float]:
    """``{eval/alarm/<statistic>: 1.0 (out of band) | 0.0}``, ``eval/<label>/alarm/…`` with a label."""
    prefix = "eval/" if label is None else f"eval/{label}/"
    return {f"{prefix}alarm/{c.statistic}": float(c.fired) for c in checks}


def drift_alarms(base_stats: Mapping[str, float], current_stats: Mapping[str, float],
                 bands: Mapping[str, DriftBand] | None = None, *, label: str | None = None) -> dict[str, float]:
    """:func:`alarm_metrics` of :func:`drift_checks`: one 0/1 per statistic present in both summaries."""
    return alarm_metrics(drift_checks(base_stats, current_stats, bands, label=label), label)
