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


def test_carry_keeps_the_figures_of_the_parts_not_run_and_not_run_names_the_rest(tmp_path, monkeypatch):
    old = {"bench": "regime", "parts": ["default_job"], "default_job_gain": 0.09, "default_job_runs": [{"seed": 0}],
           "dts_nfe_to_bestofn": None}
    path = tmp_path / "regime.json"
    path.write_text(json.dumps(old) + "\n")
    monkeypatch.setitem(regime.PARTS, "search", lambda args, out: {"dts_nfe_to_bestofn": 0.4, "search": {}})
    res = regime.main(["--parts", "search", "--carry", str(path), "--out", str(tmp_path)])
    assert res["default_job_gain"] == 0.09 and res["default_job_runs"] == [{"seed": 0}]
    assert res["carried"] == ["default_job"] and res["dts_nfe_to_bestofn"] == 0.4
    assert res["not_run"] == ["tree_nfe_to_flat_final", "pool_nfe_ratio", "pool_strict_gap", "balancer_worst_margin"]


def test_search_prompts_are_the_hardest_skills_and_the_reward_is_strict_plus_weighted_partial():
    import torch

    from flowrl.bench import regime_search as rs
    from flowrl.data.shapes.render import render_meta
    from rewards import RewardSet
    from rewards.base import make_input

    items = rs.hard_prompts(["counting"], 3)
    assert len(items) == 3 and all(m["skill"] == "counting" for _, m in items)

    class Identity:                         # the reward sees decode(latents): here the latents are pixels
        def decode(self, x):
            return x

    prompt, meta = items[0]
    pix = torch.stack([torch.from_numpy(render_meta(meta, 0)).float(), torch.rand(3, 32, 32)])  # right, noise
    score, strict = rs.scorer(Identity(), prompt, meta, 0.5)
    inp = make_input(pix, [prompt] * 2, torch.zeros(2, dtype=torch.long), [dict(meta)] * 2)
    partial = RewardSet({"shapes": 1.0})(inp).total
    exact = RewardSet({"shapes": {"weight": 1.0, "kwargs": {"mode": "strict"}}})(inp).total
    assert exact.tolist() == [1.0, 0.0] and 0.0 <= float(partial[1]) < 1.0
    assert torch.allclose(score(pix), exact + 0.5 * partial)
    assert strict(pix[:1]) == float(exact[0])


def test_worst_reward_margin_is_the_best_balancers_worst_gain_minus_the_best_sweep_points():
    gains = {"ws0": (0.10, 0.30), "ws1": (0.05, 0.50), "famo": (0.14, 0.20), "pcgrad": (0.12, 0.12)}
    result = {"sets": {"a": {"methods": {m: {"gain": {"r1": {"mean": g1}, "r2": {"mean": g2}}}
                                         for m, (g1, g2) in gains.items()}}}}
    m = regime.worst_reward_margins(result)["a"]
    # worst rewards: ws0 0.10, ws1 0.05, famo 0.14, pcgrad 0.12 → best balancer famo, best sweep ws0
    assert m["balancer"] == "famo" and m["margin"] == pytest.approx(0.04) and m["best_sweep_worst"] == 0.10


def test_balancers_part_reports_the_set_with_the_largest_margin(tmp_path):
    def one_set(sweep, balancer):
        return {"methods": {"ws0": {"gain": {"r": {"mean": sweep}}}, "gdpo": {"gain": {"r": {"mean": balancer}}}}}

    path = tmp_path / "balancers.json"
    path.write_text(json.dumps({"sets": {"x": one_set(0.2, 0.1), "y": one_set(0.1, 0.15)}, "iterations": 60,
                                "seeds": [0, 1, 2], "worst_gain_margin": 0.01}) + "\n")
    res = regime.main(["--parts", "balancers", "--balancers-result", str(path), "--out", str(tmp_path)])
    assert res["balancer_worst_margin"] == pytest.approx(0.05) and res["balancers"]["set"] == "y"
    assert "balancer_worst_margin" not in res["not_run"]


def test_tree_regime_overrides_make_the_group_the_leaves():
    from flowrl.bench.benchmarks import trees

    args = trees.parse(["--splits", "0,3,6,9", "--split-noise", "2", "--tree-prompts", "4"])
    ov = trees.tree_overrides(args)
    assert "train.group_size=16" in ov and "sampler.tree.noise={scale: 2.0}" in ov
    assert "sampler.tree.branching={kind: fixed, steps: [0, 3, 6, 9], factor: 2}" in ov
    assert "train.prompts_per_iter=4" in ov
    assert trees.tree_overrides(trees.parse([])) == []


def test_branchgrpo_20_step_tree_costs_203_forwards_per_prompt():
    """Binary splits at 0, 3, 6, 9 of 20 steps: 1 + 3·2 + 3·4 + 3·8 + 10·16 = 203 forwards per tree (step 0 runs
    the root, each split doubles the frontier after its step; reference F, BranchGRPO FLUX), against flat GRPO's
    20 per sample (the toy recipe: 8 prompts × 4)."""
    from flowrl.bench.benchmarks import trees

    args = trees.parse(["--splits", "0,3,6,9", "--tree-prompts", "4"])
    steps = ["sampler.steps=20", "sampler.eval_steps=20"]
    assert trees.nfe_per_iteration(trees.TREE, [*steps, *trees.tree_overrides(args)]) == 4 * 203
    assert trees.nfe_per_iteration(trees.GRPO, steps) == 8 * 4 * 20


def test_tree_methods_must_hold_the_comparison():
    from flowrl.bench.benchmarks import trees

    assert trees.parse(["--methods", "flat_grpo,tree_grpo"]).methods == "flat_grpo,tree_grpo"
    for bad in ("flat_grpo,mixgrpo", "flat_grpo,tree_grpo,dpo"):
        with pytest.raises(SystemExit):
            trees.parse(["--methods", bad])
