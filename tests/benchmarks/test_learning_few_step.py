"""The learning benchmark's few-step handling (flowrl/bench/learning_methods.py): which recipes get a teacher
reference, and carrying an earlier result's methods and top-level figures."""
import json

from flowrl.bench import learning_lib
from flowrl.bench import learning_methods as lm


def test_only_a_few_step_objective_gets_teacher_references():
    assert lm.is_few_step(learning_lib.recipe_path("tdm_r1"), [])
    assert not lm.is_few_step(learning_lib.recipe_path("grpo"), [])


def test_carry_keeps_earlier_methods_and_the_figures_this_run_left_empty(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"methods": {"opd": {"gain_mean": 0.07}, "tdm_r1": {"gain_mean": -1.0}},
                               "opd_gain_share": 1.017, "nft_nfe_to_grpo_final": 2.0, "table": ["x"]}))
    result = {"methods": {"tdm_r1": {"gain_mean": 0.02}}, "opd_gain_share": None, "nft_nfe_to_grpo_final": 3.0}
    lm.carry(result, [str(old)])
    assert result["methods"]["tdm_r1"] == {"gain_mean": 0.02}                    # this run's entry wins
    assert result["methods"]["opd"]["gain_mean"] == 0.07 and "carried_from" in result["methods"]["opd"]
    assert result["opd_gain_share"] == 1.017 and result["nft_nfe_to_grpo_final"] == 3.0
    assert set(result["carried_figures"]) == {"opd_gain_share"} and "table" not in result
