"""Forward-process TrainBatches: a sample's training σ's and noise come from its own generator (seeded by the step
and the sample's global row), so they do not depend on its micro-batch companions or on the process count."""
import pytest
import torch

from flowrl.objectives import nft
from flowrl.objectives.sources import FORWARD_PROCESS, Rollout
from flowrl.types import Cond, RolloutResult


def _rollout(rows):
    n = len(rows)
    x0 = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, 4, 4).clone()
    res = RolloutResult(x0, torch.linspace(1, 0, 9), None, None, 8)
    cond = Cond({"e": torch.zeros(n, 2)}, None, ["p"] * n)
    return Rollout(cond, res, 1.0, None, None, "mean", {}, torch.tensor(rows))


@pytest.mark.parametrize("timesteps", ["permuted", "decoupled"])
def test_a_rows_draws_do_not_depend_on_its_companions(timesteps):
    cfg = nft.Config()
    if timesteps == "decoupled":
        from flowrl.config.loader import Plugin
        from flowrl.objectives.timesteps import Decoupled

        cfg = nft.Config(timesteps=Plugin("decoupled", Decoupled()))
    adv = torch.zeros(2)
    both = FORWARD_PROCESS.batches(_rollout([3, 5]), adv, torch.Generator().manual_seed(11), cfg)
    alone = FORWARD_PROCESS.batches(_rollout([5]), adv[:1], torch.Generator().manual_seed(11), cfg)
    assert len(both) == len(alone)
    for b, a in zip(both, alone):
        assert torch.equal(b.sigma[1:], a.sigma)
        assert torch.equal(b.forward_noise()[1:], a.forward_noise())
    other = FORWARD_PROCESS.batches(_rollout([5]), adv[:1], torch.Generator().manual_seed(12), cfg)
    assert not torch.equal(other[0].forward_noise(), alone[0].forward_noise())   # a new step draws anew
