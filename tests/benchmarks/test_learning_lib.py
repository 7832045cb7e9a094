"""The learning benchmarks' shared library (flowrl/bench/learning_lib.py): statistics against numpy/scipy
and closed forms, interpolation on hand-made curves, the before cache, the NFE accounting on a stub trainer, the
plot; and (slow) one real toy run whose training NFEs equal the objective's closed form."""
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import stats

from flowrl.bench import learning_lib as lib
from flowrl.bench import learning_plot

ROOT = Path(__file__).resolve().parents[2]


def run(seed, points):
    """A hand-made run_recipe result: points = [(iteration, rollout_nfe, strict, partial)]."""
    curve = [{"iteration": it, "rollout_nfe": n, "train_nfe": 2 * n, "wall_s": it * 1.5, "strict": s,
              "partial": p, "detect/edge_density": 0.05 + s / 10, "alarm/stray_frac": float(s > 0.4)}
             for it, n, s, p in points]
    return {"seed": seed, "curve": curve, "before": curve[0], "after": curve[-1],
            "gain_se_eval": {"strict": 0.01 * (seed + 1), "partial": 0.005}}


def test_mean_se_matches_scipy_and_skips_missing():
    x = [0.31, 0.27, 0.36, 0.29]
    mean, se = lib.mean_se(x + [None, float("nan")])
    assert mean == pytest.approx(np.mean(x))
    assert se == pytest.approx(stats.sem(x))
    assert lib.mean_se([0.5]) == (0.5, None)
    assert lib.mean_se([None]) == (None, None)


def test_binomial_se_closed_form():
    assert lib.binomial_se(0.3, 1080) == pytest.approx(math.sqrt(0.3 * 0.7 / 1080))
    assert lib.binomial_se(0.0, 10) == 0.0
    assert lib.binomial_se(None, 10) is None


def test_bootstrap_se_estimates_the_plug_in_standard_error():
    """The bootstrap SE of a mean converges to sqrt(Σ(x − x̄)²/P)/√P (Efron & Tibshirani eq. 6.9); 2,000
    replicates leave ~1.6 % Monte-Carlo error."""
    x = np.random.default_rng(3).beta(2, 5, size=60)
    plug_in = x.std(ddof=0) / math.sqrt(x.size)
    assert lib.bootstrap_se(x) == pytest.approx(plug_in, rel=0.06)
    assert lib.bootstrap_se(x, seed=1) != lib.bootstrap_se(x, seed=2)
    assert lib.bootstrap_se([0.5]) is None


def test_nfe_to_reach_interpolates_linearly_and_first():
    curve = [(0, 0.2), (100, 0.45), (200, 0.3), (300, 0.5)]
    assert lib.nfe_to_reach(curve, 0.4) == pytest.approx(100 * 0.2 / 0.25)      # first crossing, not the last
    assert lib.nfe_to_reach(curve, 0.5) == pytest.approx(300)
    assert lib.nfe_to_reach(curve, 0.2) == 0                                     # already there at the start
    assert lib.nfe_to_reach(curve, 0.6) is None
    dicts = [{"rollout_nfe_mean": n, "strict_mean": s} for n, s in curve]      # aggregate's curve points
    assert lib.nfe_to_reach(dicts, 0.4) == pytest.approx(80)
    assert lib.nfe_to_reach([{"wall_s": 0, "partial": 0.1}, {"wall_s": 10, "partial": 0.3}], 0.2,
                            x="wall_s", y="partial") == pytest.approx(5)


def test_aggregate_means_ses_and_gains_over_seeds():
    runs = [run(0, [(0, 0, 0.3, 0.6), (10, 100, 0.35, 0.65), (20, 200, 0.40, 0.70)]),
            run(1, [(0, 0, 0.3, 0.6), (10, 100, 0.31, 0.62), (20, 200, 0.36, 0.69)]),
            run(2, [(0, 0, 0.3, 0.6), (5, 50, 0.3, 0.6), (10, 100, 0.33, 0.61), (20, 200, 0.47, 0.74)])]
    agg = lib.aggregate(runs)
    assert [p["iteration"] for p in agg["curve"]] == [0, 10, 20]             # points every run evaluated
    after = [0.40, 0.36, 0.47]
    assert agg["after"]["strict_mean"] == pytest.approx(np.mean(after))
    assert agg["after"]["strict_se"] == pytest.approx(stats.sem(after))
    assert agg["before"]["strict_se"] == 0.0
    assert agg["gain"]["strict_mean"] == pytest.approx(np.mean(after) - 0.3)
    assert agg["gain"]["strict_se"] == pytest.approx(stats.sem(after))
    assert agg["gain"]["partial_mean"] == pytest.approx(np.mean([0.70, 0.69, 0.74]) - 0.6)
    assert "rollout_nfe_mean" not in agg["gain"]                                 # counters are no gains
    assert agg["after"]["alarm/stray_frac_mean"] == pytest.approx(1 / 3)        # fraction of seeds alarmed
    assert agg["curve"][1]["train_nfe_mean"] == 200
    assert agg["gain_se_eval"]["strict"] == pytest.approx(0.02)
    assert agg["seeds"] == [0, 1, 2] and agg["n"] == 3
    with pytest.raises(ValueError, match="no runs"):
        lib.aggregate([])


def test_nfe_ratio_on_mean_curves():
    ref = lib.aggregate([run(0, [(0, 0, 0.3, 0.6), (20, 400, 0.36, 0.7)])])
    fast = lib.aggregate([run(0, [(0, 0, 0.3, 0.6), (10, 200, 0.4, 0.7), (20, 400, 0.5, 0.8)])])
    assert lib.nfe_ratio(ref, fast) == pytest.approx(400 / (200 * 0.06 / 0.1))
    never = lib.aggregate([run(0, [(0, 0, 0.3, 0.6), (20, 400, 0.31, 0.6)])])
    assert lib.nfe_ratio(ref, never) is None
    flat_ref = lib.aggregate([run(0, [(0, 0, 0.3, 0.6), (20, 400, 0.29, 0.6)])])
    assert lib.nfe_ratio(flat_ref, fast) is None                                 # reached before training


def test_before_cache_round_trips_through_disk(tmp_path):
    cache = lib.BeforeCache(tmp_path)
    entry = {"summary": {"eval/shapes/strict/mean": 0.3}, "point": {"iteration": 0, "strict": 0.3},
             "per_prompt": {"strict": [0.0, 1.0]}}
    cache.put("k1", entry)
    assert lib.BeforeCache(tmp_path).get("k1") == entry
    assert lib.BeforeCache(tmp_path).get("k2") is None
    assert lib.BeforeCache().get("k1") is None


def test_eval_point_names_and_standard_errors():
    summary = {"eval/shapes/strict/mean": 0.25, "eval/shapes/strict/std": 0.4, "eval/shapes/partial/mean": 0.6,
               "eval/palette_distance/mean": 0.013, "eval/diversity/mean": 0.15, "eval/detect/edge_density/mean":
               0.05, "eval/alarm/stray_frac": 1.0, "eval/velocity_rms/mean": float("nan"),
               "eval/num_prompts": 10.0, "eval/num_seeds": 4.0}
    pt = lib.eval_point(summary, {"strict": [0.0, 0.5, 0.25, 0.25]})
    assert (pt["strict"], pt["partial"], pt["palette"], pt["diversity"]) == (0.25, 0.6, 0.013, 0.15)
    assert pt["detect/edge_density"] == 0.05 and pt["alarm/stray_frac"] == 1.0 and pt["velocity_rms"] is None
    assert "shapes/strict" not in pt and not any(k.endswith("/std") for k in pt)
    assert pt["strict_se_binomial"] == pytest.approx(math.sqrt(0.25 * 0.75 / 40))
    assert pt["strict_se_bootstrap"] == pytest.approx(lib.bootstrap_se([0.0, 0.5, 0.25, 0.25]))


def test_read_per_prompt_averages_seeds(tmp_path):
    recs = [{"kind": "sample", "policy": "trained", "prompt_idx": p, "seed": s,
             "scores": {"shapes/strict": float(p == s), "shapes/partial": 0.5 + 0.1 * s}}
            for p in range(3) for s in range(2)] + [{"kind": "summary", "metrics": {}}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    pp = lib.read_per_prompt(tmp_path)
    assert pp["strict"] == [0.5, 0.5, 0.0]
    assert pp["partial"] == pytest.approx([0.55, 0.55, 0.55])


class StubPolicy:
    def velocity(self, x, sigma, cond, guidance=None):
        return x


def test_recorder_splits_rollout_and_training_forwards(tmp_path):
    """Rows through velocity inside the rollout stage are rollout NFEs; the rest of an iteration training NFEs;
    evaluation counts in neither. Removing the wrappers restores the classes' methods."""
    policy = StubPolicy()
    state = SimpleNamespace(rollout_nfe=0, wall_time=0.0)
    trainer = SimpleNamespace(policy=policy, state=state, cfg=SimpleNamespace(run_dir=tmp_path))

    def rollout_run(it):
        for _ in range(8):                          # 8 steps on 4 samples
            trainer.policy.velocity(torch.zeros(4, 2), 0.5, None)
        state.rollout_nfe += 32

    def iteration(it):
        trainer.rollout.run(it)
        for _ in range(3):                          # e.g. old, train and reference forwards on 4 rows
            trainer.policy.velocity(torch.zeros(4, 2), 0.5, None)
        return {}

    def evaluate(step, tag, logger):
        trainer.policy.velocity(torch.zeros(10, 2), 0.5, None)
        return {"eval/shapes/strict/mean": 0.5, "eval/num_prompts": 5.0, "eval/num_seeds": 2.0}

    trainer.rollout = SimpleNamespace(run=rollout_run)
    trainer.iteration = iteration
    trainer.evaluator = SimpleNamespace(evaluate=evaluate)
    rec = lib.Recorder(trainer)
    trainer.evaluator.evaluate(0, "before", None)
    for it in range(2):
        trainer.iteration(it)
    trainer.evaluator.evaluate(2, "after", None)
    assert rec.rollout_rows == 64 and rec.train_nfe == 24
    assert [(p["iteration"], p["rollout_nfe"], p["train_nfe"], p["strict"]) for p in rec.points] == \
        [(0, 0, 0, 0.5), (2, 64, 24, 0.5)]
    assert rec.points[1]["strict_se_binomial"] == pytest.approx(math.sqrt(0.25 / 10))
    rec.close()
    assert "velocity" not in vars(policy)
    assert trainer.evaluator.evaluate is evaluate and trainer.iteration is iteration


def test_plot_curves_draws_each_method_and_its_band(tmp_path):
    a = lib.aggregate([run(s, [(0, 0, 0.3, 0.6), (10, 100, 0.3 + 0.02 * s, 0.6), (20, 200, 0.35 + 0.03 * s,
                                                                                 0.7)]) for s in range(3)])
    b = lib.aggregate([run(s, [(0, 0, 0.3, 0.6), (10, 100, 0.4, 0.6), (20, 200, 0.45 + 0.01 * s, 0.7)])
                       for s in range(3)])
    path = lib.plot_curves({"a": a, "b": b}, tmp_path / "sub" / "c.png")
    img = np.asarray(Image.open(path).convert("RGB"))
    plot = learning_plot
    assert img.shape == (plot.HEIGHT, plot.WIDTH, 3)
    for color in plot.COLORS[:2]:
        assert (img == color).all(-1).sum() > 50                 # each method's line
    band = tuple(round(255 + (c - 255) * 60 / 255) for c in plot.COLORS[0])
    assert (np.abs(img.astype(int) - band).max(-1) <= 2).sum() > 200    # first method's translucent band


@pytest.mark.slow
def test_run_recipe_counts_closed_form_nfes_and_reuses_before(tmp_path):
    """AWR on 2 prompts × 2 samples, 8 rollout steps, one σ per sample with old, train and reference
    forwards: 32 rollout and 12 training NFEs per iteration; a second run of the same tiny model reuses the
    first's "before" (a tiny random policy's weights follow ``run.seed``, so another seed's "before" is its own)."""
    cache = lib.BeforeCache(tmp_path / "cache")
    kw = dict(iterations=2, eval_every=1, eval_seeds=[0, 1], out_dir=tmp_path, eval_prompts=2, cache=cache,
              overrides=["policy.tiny=true", "train.prompts_per_iter=2", "train.group_size=2",
                        "train.micro_batch=2"])
    first = lib.run_recipe("awr", seed=0, name="a0", **kw)
    second = lib.run_recipe("awr", seed=0, name="a1", **kw)
    other = lib.run_recipe("awr", seed=1, name="b1", **{**kw, "iterations": 1, "eval_every": 0})
    assert [(p["iteration"], p["rollout_nfe"], p["train_nfe"]) for p in first["curve"]] == \
        [(0, 0, 0), (1, 32, 12), (2, 64, 24)]
    assert first["rollout_nfe_counted"] == 64 and first["eval_images"] == 4
    assert not first["before_cached"] and second["before_cached"] and not other["before_cached"]
    assert other["before_key"] != first["before_key"]
    assert second["before"] == first["before"]
    assert not (Path(second["run_dir"]) / "eval" / "before").exists()
    assert first["after"]["strict"] is not None and "detect/edge_density" in first["after"]


def test_nfe_ratio_on_gains_measures_each_curve_from_its_own_start():

    ref = {"after": {"strict_mean": 0.40, "rollout_nfe_mean": 100.0},
           "curve": [{"rollout_nfe_mean": 0.0, "strict_mean": 0.34}, {"rollout_nfe_mean": 100.0, "strict_mean": 0.40}]}
    cand = {"curve": [{"rollout_nfe_mean": 0.0, "strict_mean": 0.29}, {"rollout_nfe_mean": 50.0, "strict_mean": 0.35},
                      {"rollout_nfe_mean": 100.0, "strict_mean": 0.38}]}
    assert lib.nfe_ratio(ref, cand) is None                     # never reaches 0.40 in absolute terms
    assert lib.nfe_ratio(ref, cand, gain=True) == 2.0          # reaches the +0.06 gain at 50 NFEs


def test_run_cache_reuses_a_finished_run_with_an_equal_config(tmp_path, monkeypatch):
    """$FLOWRL_BENCH_RUN_CACHE: a second run_recipe with the same resolved config (written elsewhere, named
    otherwise) returns the first's result without training; another seed trains."""
    monkeypatch.setenv(lib.RUN_CACHE_ENV, str(tmp_path / "finished"))
    kw = dict(iterations=1, eval_every=0, eval_seeds=[0], eval_prompts=1, cache=lib.BeforeCache(),
              overrides=["policy.tiny=true", "train.prompts_per_iter=2", "train.group_size=2",
                        "train.micro_batch=2"])
    first = lib.run_recipe("awr", seed=0, name="a", out_dir=tmp_path / "x", **kw)
    again = lib.run_recipe("awr", seed=0, name="b", out_dir=tmp_path / "y", **kw)
    other = lib.run_recipe("awr", seed=1, name="c", out_dir=tmp_path / "z", **kw)
    assert again["reused"] and again["name"] == "b" and again["curve"] == first["curve"]
    assert not (tmp_path / "y" / "b").exists()
    assert "reused" not in other and (tmp_path / "z" / "c" / "config.yaml").is_file()


def test_a_preempted_run_stops_the_benchmark_and_is_not_cached(tmp_path, monkeypatch):
    """A run the preemption signal stopped early (the trainer's summary["preempted"]) is no finished run: the
    benchmark stops with a one-line message and $FLOWRL_BENCH_RUN_CACHE stays empty, so a rerun trains it again."""
    import pytest

    from flowrl.training.trainer import Trainer

    monkeypatch.setenv(lib.RUN_CACHE_ENV, str(tmp_path / "finished"))
    monkeypatch.setattr(Trainer, "run", lambda self: {"preempted": {"signal": "SIGTERM", "iteration": 0}})
    with pytest.raises(SystemExit, match="a: preempted before its 2 iterations ended") as e:
        lib.run_recipe("awr", seed=0, name="a", out_dir=tmp_path, iterations=2, eval_every=0, eval_seeds=[0],
                       eval_prompts=1, cache=lib.BeforeCache(), overrides=["policy.tiny=true"])
    assert "\n" not in str(e.value) and not list((tmp_path / "finished").glob("*.json"))
