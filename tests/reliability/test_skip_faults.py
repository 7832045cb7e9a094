"""Non-finite values (issue #16 item 2): a reward returning ±inf for one sample no longer kills the run — the
sample is left out like NaN, counted and the reward named; a loss that is non-finite at every step stops the
run after train.max_skipped consecutive skipped updates, with a checkpoint of the last good weights and one
line on the command line (exit 1)."""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from reliability_runs import REPO, adapter, same, tiny, train_script  # noqa: E402

from flowrl.checkpoint import list_checkpoints, load_checkpoint  # noqa: E402
from flowrl.config import load_config  # noqa: E402
from flowrl.training.trainer import Trainer  # noqa: E402
from rewards import REWARDS, RewardSet, make_input  # noqa: E402

NAN_LOSS = REPO / "tests" / "trainer" / "nan_objective.py"     # GRPO's loss plus a NaN term


def one_inf(batch):
    r = torch.arange(len(batch), dtype=torch.float32)
    r[0] = float("inf")
    return r


def all_minus_inf(batch):
    return torch.full((len(batch),), float("-inf"))


REWARDS.register("test_one_inf", one_inf)
REWARDS.register("test_all_minus_inf", all_minus_inf)


def test_a_reward_may_return_inf_for_a_sample():
    out = RewardSet({"test_one_inf": 1.0, "shapes_clean": 1.0})(make_input(torch.rand(3, 3, 32, 32)))
    assert torch.isinf(out.scores[0, 0]) and torch.isfinite(out.total).all()   # the total skips the failure


def test_an_inf_reward_drops_the_sample_and_the_run_goes_on(tmp_path, capsys):
    t = Trainer(load_config(None, tiny(tmp_path, iterations=1) + ["rewards={test_one_inf: 1.0}"]))
    start = adapter(t)
    out = t.run()
    assert out["state"]["global_step"] == 2 and out["state"]["skipped_updates"] == 0
    assert out["state"]["dropped_samples"] == {"reward/test_one_inf": 1}
    assert not same(start, adapter(t))
    rec = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["skip/inf/test_one_inf"] == 1 and rec["skip/samples_dropped"] == 1
    assert "reward 'test_one_inf' returned ±inf for 1 sample(s)" in capsys.readouterr().out


def test_an_all_inf_reward_skips_the_update_and_names_it(tmp_path):
    t = Trainer(load_config(None, tiny(tmp_path, iterations=1) + ["rewards={test_all_minus_inf: 1.0}"]))
    out = t.run()
    assert out["state"]["global_step"] == 0 and out["state"]["skip_reasons"] == {"reward/test_all_minus_inf": 1}
    assert out["state"]["dropped_samples"] == {"reward/test_all_minus_inf": 4}


def test_loss_skips_stop_the_run_after_max_skipped_with_a_checkpoint(tmp_path, capsys):
    argv = ["--config", str(REPO / "configs" / "toy" / "grpo.yaml"), *tiny(tmp_path, iterations=5, objective="grpo"),
            f"objective.kind={NAN_LOSS}:loss", "train.max_skipped=3"]
    initial = adapter(Trainer(load_config(None, tiny(tmp_path, "fresh", objective="grpo"))))
    try:
        train_script().main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("error: 4 consecutive updates skipped for non-finite values (last: loss/bad_term)")
    assert "stopped at iteration 2" in err[0] and "--resume" in err[0]
    run_dir = tmp_path / "run"
    assert list_checkpoints(run_dir)[-1][0] == 2                    # written when it stopped, not after 5
    tensors, state = load_checkpoint(run_dir)
    assert state["loop"]["global_step"] == 0 and state["loop"]["consecutive_skips"] == 4
    assert same(initial, tensors["train"])                          # the last good weights: never stepped


def test_a_successful_step_resets_the_consecutive_count(tmp_path):
    t = Trainer(load_config(None, tiny(tmp_path, iterations=1)))
    t.skip("reward/x", {})
    t.skip("reward/x", {})
    assert t.state.consecutive_skips == 2 and not t.skip_limit_reached()
    t.run()
    assert t.state.consecutive_skips == 0 and t.state.skipped_updates == 2
