"""EMA against a hand-written recursion (Flow-GRPO EMAModuleWrapper semantics, ``flow_grpo/ema.py``)."""
import pytest
import torch
from torch import nn

from flowrl.policies.ema import EMA, ema_decay


def test_decay_schedule_closed_form():
    assert ema_decay(0, 0.9, True) == pytest.approx(1 / 10)
    assert ema_decay(7, 0.9, True) == pytest.approx(8 / 17)
    assert ema_decay(1000, 0.9, True) == 0.9
    assert ema_decay(0, 0.9, False) == 0.9


def test_update_matches_recursion_and_interval():
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(5))
    ema = EMA([p], decay=0.9, update_interval=3, warmup=True)
    ref = p.detach().clone()
    for step in range(12):
        with torch.no_grad():
            p.add_(torch.randn(5))
        did = ema.update(step)
        assert did == ((step + 1) % 3 == 0)
        if did:
            beta = min((1 + step) / (10 + step), 0.9)
            ref = beta * ref + (1 - beta) * p.detach()
    torch.testing.assert_close(ema.shadow[0], ref, atol=1e-6, rtol=1e-6)
    assert ema.num_updates == 4


def test_store_copy_restore_and_state_round_trip():
    torch.manual_seed(1)
    params = [nn.Parameter(torch.randn(3, 2)), nn.Parameter(torch.randn(4))]
    ema = EMA(params, decay=0.5, update_interval=1, warmup=False)
    with torch.no_grad():
        for q in params:
            q.mul_(3)
    ema.update(0)
    live = [q.detach().clone() for q in params]
    ema.store()
    ema.copy_to()
    assert all(torch.equal(q, s) for q, s in zip(params, ema.shadow))
    ema.restore()
    assert all(torch.equal(q, kept) for q, kept in zip(params, live))
    other = EMA([nn.Parameter(torch.zeros(3, 2)), nn.Parameter(torch.zeros(4))])
    other.load_state_dict(ema.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(other.shadow, ema.shadow))
    assert (other.decay, other.update_interval, other.num_updates) == (0.5, 1, 1)
    with pytest.raises(ValueError, match="tracks"):
        EMA([params[0]]).load_state_dict(ema.state_dict())
    with pytest.raises(RuntimeError, match="store"):
        ema.restore()
