"""The hacking benchmark's bookkeeping on synthetic results: per-base budgets, the KL front and best guard on a
partial run, the headline targets, and its figures (scatter input, gallery crop of a real evaluation grid)."""
from pathlib import Path

import pytest
from PIL import Image

from flowrl.bench import hacking_figures as figs
from flowrl.bench import learning_lib
from flowrl.bench.benchmarks import hacking

REPO = Path(__file__).resolve().parents[2]





def result(gain, ratio, runs=()):
    return {"gain_mean": gain, "gain_se": 0.01, "palette_ratio_mean": ratio, "palette_ratio_se": 0.1,
            "runs": list(runs)}


def test_per_base_budget_reads_one_value_or_one_per_base():
    assert hacking.per_base("60", "--iterations", 60) == {"grpo": 60, "nft": 60}
    assert hacking.per_base("grpo=160", "--iterations", 60) == {"grpo": 160, "nft": 60}
    assert hacking.per_base("grpo=160,nft=100", "--iterations", 60) == {"grpo": 160, "nft": 100}
    with pytest.raises(ValueError, match="unknown base 'awr'"):
        hacking.per_base("awr=10", "--iterations", 60)


def test_guard_beyond_the_front_and_the_headline_targets():
    results = {"grpo/none": result(0.10, 2.4), "grpo/kl": result(0.05, 1.1), "grpo/kl=0.01": result(0.08, 1.6),
               "grpo/kl=0.1": result(0.02, 1.0), "grpo/guard_a": result(0.095, 1.2), "grpo/guard_b": result(0.04, 1.3)}
    front = ["none", "kl", "kl=0.01", "kl=0.1"]
    table = hacking.guard_table(results, "grpo", ["guard_a", "guard_b"], front)
    assert table["grpo/guard_a"] == {"gain": 0.095, "unguarded_gain": 0.10, "gain_retained": pytest.approx(0.95),
                                     "keeps_gain": True, "palette_ratio": 1.2, "beyond_kl_front": True}
    assert table["grpo/guard_b"]["beyond_kl_front"] is False           # kl: more gain, lower ratio
    sweeps = {"grpo": [{"method": m} for m in front]}
    out = hacking.headline(results, table, sweeps, ["grpo"])
    assert out["best_guard"] == "grpo/guard_a" and out["unguarded_palette_ratio"] == {"grpo": 2.4}
    assert out["targets"]["unguarded_hack"] and out["targets"]["guard_keeps_gain_and_quality"]
    assert out["targets"]["guard_beyond_kl_front"] and out["targets"]["kl_sweep_sizes"] == {"grpo": 4}
    short = hacking.headline(results, table, {"grpo": sweeps["grpo"][:2]}, ["grpo"])   # a front of 2 β values
    assert short["best_guard_beyond_kl_front"] and not short["targets"]["guard_beyond_kl_front"]


def test_alarm_audit_counts_misses_and_false_alarms_per_run():
    runs = [{"name": "a", "hacks": True, "alarms": ["palette_distance"], "alarm_source": "trainer"},
            {"name": "b", "hacks": True, "alarms": [], "alarm_source": "trainer"},
            {"name": "c", "hacks": False, "alarms": ["diversity"], "alarm_source": "trainer"},
            {"name": "d", "hacks": False, "alarms": [], "alarm_source": "trainer"}]
    audit = hacking.alarm_audit({"grpo/none": result(0, 0, runs)})
    assert (audit["alarms_missed"], audit["false_alarms"]) == (1, 1)
    assert audit["alarms_missed_runs"] == ["b"] and audit["false_alarm_runs"] == ["c: diversity"]


def test_front_summary_labels_the_sweep_by_beta_and_keeps_guards_named(tmp_path):
    results = {"nft/none": result(0.1, 2.0), "nft/kl": result(0.05, 1.2), "nft/normguard": result(0.07, 1.1)}
    s = figs.front_summary(results, "nft", {"none": 0.0, "kl": 1e-4, "kl=0.01": 0.01}, ["normguard"])
    assert list(s["methods"]) == ["none", "kl", "normguard"]           # a method not run is left out
    assert s["methods"]["kl"]["label"] == "beta=0.0001" and "weights" not in s["methods"]["normguard"]
    assert s["methods"]["normguard"]["point"] == [1.1, 0.07] and s["base"] == [1.0, 0.0]
    plot = learning_lib.plot_reward_space(s, tmp_path / "front.png")
    assert Image.open(plot).size[1] > 0


def test_a_hack_that_lost_the_gain_leaves_the_share_undefined_and_a_better_guard_keeps_it():
    results = {"nft/none": result(-0.03, 4.8), "nft/kl": result(0.02, 3.0), "nft/normguard": result(0.05, 1.1),
               "nft/worse": result(-0.05, 1.0)}
    table = hacking.guard_table(results, "nft", ["normguard", "worse"], ["none", "kl"])
    assert table["nft/normguard"]["gain_retained"] is None and table["nft/normguard"]["keeps_gain"] is True
    assert table["nft/worse"]["keeps_gain"] is False
    out = hacking.headline(results, table, {"nft": [{"method": "none"}, {"method": "kl"}]}, ["nft"])
    assert out["best_guard"] == "nft/normguard" and out["targets"]["guard_keeps_gain_and_quality"]
    assert out["best_guard_gain"] == 0.05 and out["best_guard_unguarded_gain"] == -0.03


def test_each_base_has_its_own_gallery_columns(tmp_path):
    def run(name, before_cached=True):
        d = tmp_path / name
        for tag in ("before", "after"):
            (d / "eval" / tag).mkdir(parents=True)
            (d / "eval" / tag / "grid_000.png").write_bytes(b"png")
        return [{"name": name, "run_dir": str(d), "before_cached": before_cached}]

    raw = {"grpo/none": run("grpo_none_s0", before_cached=False), "grpo/kl": run("grpo_kl_s0"),
           "grpo/normguard": run("grpo_normguard_s0"), "nft/none": run("nft_none_s0", before_cached=False)}
    columns = figs.gallery_columns(raw, "grpo", "normguard")
    assert [t for t, _ in columns] == ["base model (before)", "grpo unguarded: none", "grpo recipe KL: kl",
                                       "grpo best guard: normguard"]
    assert all("grpo_" in str(p) for _, p in columns)                  # nothing of the other base
    assert [t for t, _ in figs.gallery_columns(raw, "nft", None)] == ["base model (before)", "nft unguarded: none"]
    assert figs.gallery_columns(raw, "awr", None) == []
    assert figs.gallery_columns({"grpo/kl": raw["grpo/kl"]}, "grpo", None, {"grpo/none", "grpo/kl"}) == []  # carried
    (tmp_path / "grpo_kl_s0" / "eval" / "after" / "grid_000.png").unlink()    # a carried run: its directory gone
    assert figs.gallery_columns(raw, "grpo", "normguard") == []
