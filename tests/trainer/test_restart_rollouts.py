"""sampler.restart: Restart sampling as the rollout of a forward-process objective, from YAML."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import toy_overrides

from flowrl.config import load_config
from flowrl.training.trainer import Trainer


def _trainer(tmp_path, *extra):
    return Trainer(load_config(None, toy_overrides(tmp_path, "nft") + list(extra)))


def test_restart_rollouts_cost_their_jumps_and_train(tmp_path):
    t = _trainer(tmp_path, "sampler.restart={intervals: [{t_min: 0.3, t_max: 0.8, n_steps: 2, K: 1}]}")
    s = t.rollout.run(0)
    steps = t.cfg.sampler.steps
    assert s.result.nfe == steps + 1 * 2                 # the main pass + K backward passes of n_steps
    assert s.rollout_nfe == (steps + 2) * 4
    out = t.run()
    assert out["state"]["global_step"] == t.cfg.train.iterations * t.cfg.train.updates_per_epoch


def test_restart_without_jumps_is_the_plain_ode_rollout(tmp_path):
    plain = _trainer(tmp_path, "run.name=plain").rollout.run(0)
    no_jump = _trainer(tmp_path, "run.name=k0",
                       "sampler.restart={intervals: [{t_min: 0.3, t_max: 0.8, n_steps: 2, K: 0}]}").rollout.run(0)
    assert torch.equal(plain.result.latents, no_jump.result.latents)


def test_restart_refuses_a_stochastic_kernel(tmp_path):
    with pytest.raises(ValueError, match="sampler.restart"):
        Trainer(load_config(None, toy_overrides(tmp_path, "grpo") + ["sampler.restart={}"]))
