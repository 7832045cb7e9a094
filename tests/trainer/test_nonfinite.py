"""A non-finite reward or loss skips the update, is counted, and names the reward / loss term."""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import toy_overrides

from flowrl.config import load_config
from flowrl.training.trainer import Trainer
from rewards import REWARDS


def all_nan(batch):
    return torch.full((len(batch),), float("nan"))


def first_nan(batch):
    r = torch.arange(len(batch), dtype=torch.float32)
    r[0] = float("nan")
    return r


REWARDS.register("test_all_nan", all_nan)
REWARDS.register("test_first_nan", first_nan)
NO_EVAL = ["eval.before=false", "eval.after=false"]


def weights(t):
    return {k: v.clone() for k, v in t.policy.adapter_state_dict("train").items()}


def records(tmp_path, name):
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_nan_reward_skips_the_update_and_names_the_reward(tmp_path):
    cfg = load_config(None, toy_overrides(tmp_path, "grpo", "nan", 1) + NO_EVAL + ["rewards={test_all_nan: 1.0}"])
    t = Trainer(cfg)
    before = weights(t)
    out = t.run()
    assert out["state"]["skipped_updates"] == 1 and out["state"]["global_step"] == 0
    assert out["state"]["skip_reasons"] == {"reward/test_all_nan": 1}
    assert all(torch.equal(v, weights(t)[k]) for k, v in before.items())
    rec = records(tmp_path, "nan")[-1]
    assert rec["skip/update"] == 1 and rec["reward/test_all_nan/nonfinite"] == 4


def test_a_nan_sample_is_left_out_and_the_rest_trains(tmp_path):
    cfg = load_config(None, toy_overrides(tmp_path, "grpo", "part", 1) + NO_EVAL + ["rewards={test_first_nan: 1.0}"])
    t = Trainer(cfg)
    before = weights(t)
    out = t.run()
    assert out["state"]["skipped_updates"] == 0 and out["state"]["global_step"] == 2
    assert not all(torch.equal(v, weights(t)[k]) for k, v in before.items())
    assert records(tmp_path, "part")[-1]["skip/samples_dropped"] == 1


def test_nan_loss_term_skips_the_optimizer_step_and_names_the_term(tmp_path):
    fake = Path(__file__).with_name("nan_objective.py")
    cfg = load_config(None, toy_overrides(tmp_path, "grpo", "loss", 1) + NO_EVAL
                      + [f"objective.kind={fake}:loss", "train.max_skipped=100"])
    t = Trainer(cfg)
    before = weights(t)
    out = t.run()
    assert out["state"]["global_step"] == 0 and out["state"]["skipped_updates"] == 2
    assert out["state"]["skip_reasons"] == {"loss/bad_term": 2}
    assert all(torch.equal(v, weights(t)[k]) for k, v in before.items())
