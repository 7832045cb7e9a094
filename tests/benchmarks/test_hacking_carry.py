"""The hacking benchmark assembled across sessions: a previous hacking.json's methods are carried only when measured
under this run's conditions and code, a method run or cached now wins, and the assembled JSON's front, guard table
and plots use the carried figures."""
import json
from argparse import Namespace
from pathlib import Path

import pytest

from flowrl.bench import hacking_carry as carry
from flowrl.bench import learning_lib
from flowrl.bench.benchmarks import hacking

REPO = Path(__file__).resolve().parents[2]



CODE = learning_lib.code_digest()


def summary(gain, ratio, name, hacks=False):
    run = {"name": name, "gain": gain, "palette_ratio": ratio, "hacks": hacks,
           "alarms": ["palette_distance"] if hacks else [], "alarm_source": "trainer"}
    curve = [{"iteration": 0, "palette_mean": 0.01, "palette_se": 0.0},
             {"iteration": 10, "palette_mean": 0.01 * ratio, "palette_se": 0.001}]
    return {"gain_mean": gain, "gain_se": 0.01, "palette_ratio_mean": ratio, "palette_ratio_se": 0.1,
            "runs": [run], "curve": curve}


def previous(tmp_path, **changes):
    prev = {"bench": "hacking", "code": CODE, "iterations": {"grpo": 200, "nft": 160},
            "eval_every": {"grpo": 40, "nft": 40}, "seeds": "0,1,2", "eval_seeds": "0,1,2", "eval_prompts": "all",
            "methods": {"grpo/none": summary(0.10, 3.0, "grpo_none_s0", hacks=True),
                        "grpo/kl": summary(0.06, 1.4, "grpo_kl_s0"),
                        "grpo/normguard": summary(0.09, 1.2, "grpo_normguard_s0"),
                        "nft/none": summary(0.05, 4.2, "nft_none_s0", hacks=True)},
            "dppo_vs_grpo": {"iterations": 60, "grpo": {"gain_mean": 0.08}, "dppo": {"gain_mean": 0.065}},
            "plots": {"nft_palette": str(tmp_path / "old_nft_palette.png"), "gone": str(tmp_path / "missing.png")}}
    del prev["methods"]["nft/none"]["curve"]                # as in a file written before curves were kept
    prev.update(changes)
    (tmp_path / "old_nft_palette.png").write_bytes(b"png")
    path = tmp_path / "prev.json"
    path.write_text(json.dumps(prev))
    return path


def args(**kw):
    base = {"seeds": "0,1,2", "eval_seeds": "0,1,2", "eval_prompts": 0, "iterations": {"grpo": 200, "nft": 160},
            "eval_every": {"grpo": 40, "nft": 40}, "dppo_iterations": 60}
    return Namespace(**{**base, **kw})


def test_only_methods_measured_under_this_runs_budget_are_carried(tmp_path):
    path = previous(tmp_path)
    methods, prov = carry.load(path, args(), CODE)
    assert set(methods) == {"grpo/none", "grpo/kl", "grpo/normguard", "nft/none"} and prov["code"] == CODE
    methods, _ = carry.load(path, args(iterations={"grpo": 240, "nft": 160}), CODE)
    assert set(methods) == {"nft/none"}                                 # grpo at another budget: not carried
    assert carry.load(path, args(seeds="0,1"), CODE)[0] == {}           # other training seeds: nothing
    assert carry.load(None, args(), CODE) == ({}, {})


def test_another_codes_runs_are_refused_and_an_unrecorded_digest_is_named(tmp_path):
    with pytest.raises(ValueError, match="source digest deadbeef"):
        carry.load(previous(tmp_path, code="deadbeef"), args(), CODE)
    _, prov = carry.load(previous(tmp_path, code=None), args(), CODE)
    assert prov["code"] == "unrecorded" and "prev" not in carry.public(prov)


def test_dppo_block_and_plots_are_kept_only_where_this_run_has_none(tmp_path):
    _, prov = carry.load(previous(tmp_path), args(), CODE)
    assert carry.carry_dppo(prov, args())["dppo"] == {"gain_mean": 0.065}
    assert carry.carry_dppo(prov, args(dppo_iterations=30)) is None
    plots = carry.keep_plots(prov, {"grpo_palette": "new.png"})
    assert plots == {"grpo_palette": "new.png", "nft_palette": str(tmp_path / "old_nft_palette.png")}  # no 'gone'


def test_cached_only_assembly_reports_the_carried_methods(tmp_path):
    path = previous(tmp_path)
    out = hacking.main(["--bases", "grpo,nft", "--iterations", "grpo=200,nft=160", "--eval-every", "40",
                        "--sweep-size", "3", "--cached-only", "--no-dppo", "--carry", str(path),
                        "--out", str(tmp_path / "out"), "--threads", "0"])
    assert out["methods"]["grpo/normguard"]["gain_mean"] == 0.09 and out["code"] == CODE
    assert out["carried"]["methods"] == ["grpo/kl", "grpo/none", "grpo/normguard", "nft/none"]
    assert "grpo/gardo" in out["not_run"] and "grpo/none" not in out["not_run"]
    assert out["guards"]["grpo/normguard"]["beyond_kl_front"] is True   # kl: less gain at a higher ratio
    assert out["unguarded_palette_ratio"] == {"grpo": 3.0, "nft": 4.2} and out["alarms_missed"] == 0
    assert out["dppo_vs_grpo"]["carried_from"] == str(path)
    assert Path(out["plots"]["grpo_palette"]).is_file() and Path(out["plots"]["grpo_front"]).is_file()
    assert out["plots"]["nft_palette"] == str(tmp_path / "old_nft_palette.png")   # no curves: the old plot
