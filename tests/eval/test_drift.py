"""Drift bands (flowrl.eval.drift): the half-width rule max(k·SE, rel·|base|, abs_floor), directions, and how
statistics are found in run_eval summaries."""
from __future__ import annotations

import math

import pytest

from flowrl.eval.drift import DEFAULT_BANDS, DriftBand, drift_alarms, drift_checks, statistic_stem


def summary(prefix="eval/", prompts=10, seeds=10, **stems):
    """A run_eval-style summary: stems {name: (mean, std)} plus the evaluation's size."""
    out = {"eval/num_prompts": float(prompts), "eval/num_seeds": float(seeds)}
    for stem, (mean, std) in stems.items():
        name = stem.replace("__", "/")
        out[f"{prefix}{name}/mean"], out[f"{prefix}{name}/std"] = mean, std
    return out


def test_each_term_of_the_half_width_can_bind():
    band = DriftBand("both", k_se=5.0, rel=0.1, abs_floor=0.01)
    se = 0.1 / math.sqrt(99)
    assert band.half_width(0.2, se) == pytest.approx(5 * se)     # k·SE = 0.0503 > rel·|m| = 0.02 > 0.01
    assert band.half_width(2.0, se) == pytest.approx(0.2)        # rel·|m|
    assert band.half_width(0.0, 0.0) == pytest.approx(0.01)      # abs_floor
    base = summary(detect__edge_density=(0.2, 0.1))              # 10 prompts × 10 seeds: n = 100
    for value, fired in [(0.2 + 5 * se - 1e-6, False), (0.2 + 5 * se + 1e-6, True), (0.2 - 5 * se - 1e-6, True)]:
        (check,) = drift_checks(base, summary(detect__edge_density=(value, 0.1)), {"edge_density": band})
        assert check.fired is fired and check.low == pytest.approx(0.2 - 5 * se)
        assert ("within" in check.describe()) is not fired


def test_directions_and_units():
    base = summary(detect__dark_frac=(0.1, 0.0), diversity=(0.2, 0.1))
    up, down = DriftBand("up", abs_floor=0.05, rel=0.0), DriftBand("down", abs_floor=0.05, rel=0.0)
    darker, lighter = summary(detect__dark_frac=(0.2, 0.0)), summary(detect__dark_frac=(0.0, 0.0))
    assert drift_alarms(base, darker, {"dark_frac": up}) == {"eval/alarm/dark_frac": 1.0}
    assert drift_alarms(base, lighter, {"dark_frac": up}) == {"eval/alarm/dark_frac": 0.0}
    assert drift_alarms(base, lighter, {"dark_frac": down}) == {"eval/alarm/dark_frac": 1.0}
    # unit "prompts": SE = std / sqrt(prompts − 1) = 0.1/3, k = 3 → half-width 0.1 (not 0.1·3/sqrt(99))
    band = DriftBand("down", k_se=3.0, rel=0.0, abs_floor=0.0, unit="prompts")
    (check,) = drift_checks(base, summary(diversity=(0.15, 0.1)), {"diversity": band})
    assert check.low == pytest.approx(0.1) and not check.fired and math.isinf(check.high)


def test_standard_error_needs_the_evaluation_size():
    """Without eval/num_prompts and eval/num_seeds (or n < 2) the band is rel/abs_floor only."""
    band = DriftBand("both", k_se=5.0, rel=0.0, abs_floor=0.01)
    base = summary(detect__edge_density=(0.2, 0.1))
    cur = summary(detect__edge_density=(0.23, 0.1))
    assert drift_alarms(base, cur, {"edge_density": band}) == {"eval/alarm/edge_density": 0.0}
    del base["eval/num_prompts"]
    assert drift_alarms(base, cur, {"edge_density": band}) == {"eval/alarm/edge_density": 1.0}
    assert drift_alarms(summary(prompts=1, seeds=1, detect__edge_density=(0.2, 0.1)), cur,
                        {"edge_density": band}) == {"eval/alarm/edge_density": 1.0}


def test_statistics_are_found_by_stem_and_label():
    base = summary(palette_distance=(0.013, 0.004), detect__stray_frac=(0.001, 0.004))
    assert statistic_stem(base, "palette_distance") == "eval/palette_distance"
    assert statistic_stem(base, "stray_frac") == "eval/detect/stray_frac"
    assert statistic_stem(base, "dark_frac") is None
    cur = summary("eval/step_9/", palette_distance=(0.03, 0.004), detect__stray_frac=(0.001, 0.004))
    cur.update(summary("eval/base/", palette_distance=(0.013, 0.004)))
    assert drift_alarms(base, cur, label="step_9") == {"eval/step_9/alarm/palette_distance": 1.0,
                                                       "eval/step_9/alarm/stray_frac": 0.0}
    assert drift_alarms(base, cur) == {}                          # nothing under eval/ without the label
    nan = summary(palette_distance=(math.nan, math.nan))
    assert drift_alarms(base, nan) == {} and drift_alarms(nan, base) == {}


def test_default_bands_cover_every_statistic_and_fire_on_the_measured_unirl_hack():
    """UniRL PR #407: dark fraction 0.451 → 0.926, edge density −60 %, entropy −54 %."""
    assert set(DEFAULT_BANDS) == {"dark_frac", "bright_frac", "edge_density", "color_entropy", "palette_distance",
                                  "stray_frac", "diversity"}
    base = summary(prompts=64, seeds=2, detect__dark_frac=(0.451, 0.3), detect__edge_density=(0.10, 0.05),
                   detect__color_entropy=(5.0, 1.0))
    hacked = summary(prompts=64, seeds=2, detect__dark_frac=(0.926, 0.1), detect__edge_density=(0.04, 0.05),
                     detect__color_entropy=(2.3, 1.0))
    assert drift_alarms(base, hacked) == {f"eval/alarm/{s}": 1.0 for s in ("dark_frac", "edge_density",
                                                                          "color_entropy")}
    assert set(drift_alarms(base, base).values()) == {0.0}


def test_palette_distance_band_matches_the_documented_toy_runs():
    """docs/training.md: base 0.0129; default recipe 0.0229 (clean shapes) must pass, β_KL 1e-4's 0.0263
    (the doubling that motivated the guard) must fire (90 prompts × 3 seeds, per-image std ≈ 0.004)."""
    base = summary(prompts=90, seeds=3, palette_distance=(0.0129, 0.004))
    assert drift_alarms(base, summary(palette_distance=(0.0229, 0.006))) == {"eval/alarm/palette_distance": 0.0}
    assert drift_alarms(base, summary(palette_distance=(0.0263, 0.006))) == {"eval/alarm/palette_distance": 1.0}


def test_bad_bands_are_explained():
    with pytest.raises(ValueError, match="direction must be one of"):
        DriftBand("sideways")
    with pytest.raises(ValueError, match="unit must be one of"):
        DriftBand(unit="pixels")
    with pytest.raises(ValueError, match="rel must be a finite number >= 0"):
        DriftBand(rel=-0.1)
