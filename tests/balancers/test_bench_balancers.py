"""The balancer benchmark's statistics on synthetic runs: hypervolume, dominance, t-intervals, worst gains and
the headline keys (flowrl/bench/benchmarks/balancers.py)."""

import numpy as np
import pytest
from PIL import Image

from flowrl.bench import learning_lib, learning_plot
from flowrl.bench.benchmarks import balancers as bench


def run(before: dict, after: dict, train_s=10.0, neg=None) -> dict:
    return {"before": before, "after": after, "train_s": train_s, "neg_cos_frac": neg, "diagnose_s": 0.0,
            "diagnosed": 0, "alpha": {"alpha_0": 0.5, "alpha_1": 0.5}}


def test_hypervolume_dominance_and_interval():
    assert bench.hypervolume([0.5, 0.7], [0.2, 0.5]) == pytest.approx(0.3 * 0.2)
    assert bench.hypervolume([0.1, 0.7], [0.2, 0.5]) == 0.0              # worse than base on one reward
    assert bench.dominates([0.5, 0.6], [0.5, 0.5]) and not bench.dominates([0.5, 0.5], [0.5, 0.5])
    assert not bench.dominates([0.6, 0.4], [0.5, 0.5])
    ci = bench.mean_ci([1.0, 2.0, 3.0])
    assert ci["mean"] == 2.0 and ci["ci95"] == pytest.approx(4.303 * 1.0 / 3 ** 0.5)
    assert bench.mean_ci([None, 1.0]) == {"mean": 1.0, "ci95": None}


def test_conflict_set_summary_headline_and_scatter(tmp_path):
    base = {"shapes_count_only": 0.4, "shapes_ink_budget": 0.5}
    pts = {"ws0": (0.6, 0.6), "ws1": (0.5, 0.8), "ws2": (0.7, 0.52), "marble": (0.55, 0.7),
           "famo": (0.55, 0.55)}
    by = {m: [run(base, {"shapes_count_only": c + d, "shapes_ink_budget": i - d},
                  12.0 if m == "marble" else 10.0) for d in (-0.01, 0.01)] for m, (c, i) in pts.items()}
    s = bench.summarise_set("count_vs_ink", by)
    m = s["methods"]
    assert m["marble"]["hv"] == pytest.approx(0.15 * 0.2) and m["marble"]["dominated_by"] == []
    assert m["famo"]["dominated_by"] == ["ws0"]                          # (0.6, 0.6) ≥ (0.55, 0.55)
    assert s["hv_sweep_median"] == pytest.approx(0.2 * 0.1)              # HVs 0.02, 0.03, 0.006
    assert m["marble"]["worst_normalised_gain"] == pytest.approx(min(0.15 / 0.3, 0.2 / 0.3))
    assert m["ws1"]["weights"] == [0.1, 0.9]
    png = learning_lib.plot_reward_space(s, tmp_path / "scatter.png")
    img = np.asarray(Image.open(png).convert("RGB"))
    plot = learning_plot
    assert img.shape == (plot.PANEL, plot.PANEL, 3)                       # two rewards: one panel
    for color in (plot.BALANCER_COLORS[0], plot.BALANCER_COLORS[1], plot.SWEEP):   # marble, famo, the sweep
        assert (img == color).all(axis=-1).sum() >= 20
    result = {"sets": {"count_vs_ink": s}}
    bench.headline(result)
    assert result["count_vs_ink/dominated"] == {"marble": False, "famo": True}
    assert result["marble_cost_ratio"] == pytest.approx(1.2)


def test_specialist_worst_skill_margin(tmp_path):
    skills = bench.SKILLS
    before = {f"shapes/skill_{s}": 0.3 for s in skills} | {r: 0.5 for r in bench.SETS["specialist"][0]}

    def after(worst):
        return {f"shapes/skill_{s}": 0.5 for s in skills} | {"shapes/skill_relation": 0.3 + worst} | {
            r: 0.6 for r in bench.SETS["specialist"][0]}

    by = {m: [run(before, after(w))] for m, w in (("ws0", 0.01), ("ws1", 0.02), ("gdpo", 0.07))}
    result = {"sets": {"specialist": bench.summarise_set("specialist", by)}}
    bench.headline(result)
    assert result["worst_gain_margin"] == pytest.approx(0.05)
    png = learning_lib.plot_reward_space(result["sets"]["specialist"], tmp_path / "specialist.png")
    assert Image.open(png).size == (3 * 420, 420)                        # three rewards: three pair panels
    gdpo = result["sets"]["specialist"]["methods"]["gdpo"]
    assert gdpo["skill_gain"]["color"]["mean"] == pytest.approx(0.2)


def test_plan_quick_covers_every_balancer_and_rejects_unknowns():
    pairs = bench.plan(bench.parse(["--quick"]))
    assert {m for _, m in pairs} == {"ws0", "ws1", *bench.BALANCERS}
    full = bench.plan(bench.parse([]))
    assert sum(1 for s, m in full if s == "specialist" and m.startswith("ws")) >= 5
    with pytest.raises(SystemExit, match="unknown method"):
        bench.plan(bench.parse(["--methods", "ws,nash"]))
    with pytest.raises(SystemExit, match="unknown set"):
        bench.plan(bench.parse(["--sets", "palette"]))
    assert bench.method_overrides("count_vs_ink", "ws1") == ["rewards.shapes_count_only.weight=0.1",
                                                            "rewards.shapes_ink_budget.weight=0.9"]
