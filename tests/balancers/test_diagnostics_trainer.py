"""In the real loop (tiny toy policy, NFT, two rewards): conflict diagnostics are logged and change nothing in
training — the weights after two iterations are bitwise those of the same run without diagnostics."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from flowrl.config import load_config
from flowrl.training.advantage import AdvantageStage
from flowrl.training.trainer import Trainer

_spec = importlib.util.spec_from_file_location("trainer_helpers",
                                               Path(__file__).parents[1] / "trainer" / "conftest.py")
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
toy_overrides = _helpers.toy_overrides


def run(tmp_path, name: str, diagnose_every: int, balancer: str) -> tuple[dict, list[dict]]:
    ov = toy_overrides(tmp_path, "nft", name=name) + [
        "rewards={jpeg_compressibility: 1.0, shapes_centering: 0.5}",
        f"advantage.balancer={{kind: {balancer}}}", "eval.before=false", "eval.after=false",
        "checkpoint.every=0"]
    cfg = load_config(None, ov)
    t = Trainer(cfg)
    p, tc = t.parts, cfg.train       # the stage as the trainer builds it, with diagnostics on or off
    t.advantages = AdvantageStage(p.balancer, cfg.advantage.balancer.config, t.advantages.weights,
                                  p.objective, p.objective_cfg, p.balancer_state,
                                  prompts_per_iter=tc.prompts_per_iter, group_size=tc.group_size,
                                  diagnose_every=diagnose_every, reward_names=list(cfg.rewards))
    t.run()
    recs = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    return t.policy.adapter_state_dict("train"), recs


@pytest.mark.slow
def test_diagnostics_are_logged_and_leave_training_unchanged(tmp_path):
    """PCGrad asks for its own Gram too: the diagnostic request on the same iteration must not disturb it."""
    plain, recs0 = run(tmp_path, "plain", 0, "pcgrad")
    diagnosed, recs1 = run(tmp_path, "diag", 1, "pcgrad")
    for k in plain:
        assert torch.equal(plain[k], diagnosed[k]), k
    train_recs = [r for r in recs1 if "adv/mean" in r]
    assert len(train_recs) == 2
    for r in train_recs:
        assert r["balance/neg_cos_any"] in (0.0, 1.0) and -1 <= r["balance/cos_min"] <= 1
        assert {"balance/cos_jpeg_compressibility", "balance/cos_shapes_centering"} <= set(r)
        assert abs(r["adv/alpha_0"] + r["adv/alpha_1"] - 1) < 1e-5
    assert not any("balance/neg_cos_any" in r for r in recs0)
