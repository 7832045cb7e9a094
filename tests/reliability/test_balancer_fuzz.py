"""Every registered balancer, on any finite input (issue #16 item 6): rewards of any magnitude up to float32's
limit (NaN = "does not apply"), any grouping (empty batches, singleton groups, one group), any reward count,
any static weights, a random PSD Gram for the balancers that ask for one, two calls in a row (stateful ones):
the advantages are finite (NaN or 0 where no reward applies, NaN on MC-GRPO's dropped median) — or the balancer
refuses with a one-line ValueError raised by flowrl's own validation, never a raw error from inside torch."""
from __future__ import annotations

import dataclasses
import traceback
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrl.balancers import BALANCERS, get_balancer
from flowrl.balancers.advantages import batch_normalize, group_advantages
from flowrl.balancers.services import FixedGram

F32_MAX = float(torch.finfo(torch.float32).max)
FLOWRL = str(Path(__file__).resolve().parents[2] / "flowrl")
EXTREMES = [0.0, -0.0, 1e-45, -1e-45, 1e-30, 1.0, -1.0, 1e30, -1e30, 3e38, -3e38, F32_MAX, -F32_MAX]
DROPS_MEDIAN = {"mc_grpo"}          # NaN advantage on each group's median rollout (it is left out of the loss)

reward = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32), st.sampled_from(EXTREMES),
                   st.just(float("nan")))


@st.composite
def problems(draw):
    K = draw(st.integers(1, 3))
    N = draw(st.integers(0, 10))
    R = torch.tensor(draw(st.lists(st.lists(reward, min_size=K, max_size=K), min_size=N, max_size=N)),
                     dtype=torch.float32).reshape(N, K)
    groups = torch.tensor(draw(st.lists(st.integers(0, 3), min_size=N, max_size=N)), dtype=torch.long)
    w = draw(st.one_of(st.none(), st.lists(st.floats(-10, 1e3, width=32), min_size=K, max_size=K)))
    g = draw(st.lists(st.floats(-1e3, 1e3, width=32), min_size=K * 3, max_size=K * 3))
    grad = torch.tensor(g, dtype=torch.float64).reshape(K, 3)
    return R, groups, None if w is None else torch.tensor(w), grad @ grad.T


def raised_by_flowrl(e: BaseException) -> bool:
    """The innermost frame of the error is flowrl code (its own validation), not torch's internals."""
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(FLOWRL)


def check_call(name, R, groups, w, state, gram):
    spec = get_balancer(name)
    try:
        adv, diag = spec.balance(R, groups, w, state, spec.Config(), services=FixedGram(gram))
    except ValueError as e:
        msg = str(e)
        assert msg and "\n" not in msg and raised_by_flowrl(e), f"{name}: unclear ValueError {msg!r}"
        return False
    assert adv.shape == (R.shape[0],) and adv.dtype == R.dtype, name
    assert not torch.isinf(adv).any(), f"{name}: ±inf advantage for R={R.tolist()} groups={groups.tolist()}"
    applies = torch.isfinite(R).any(1)
    idle = adv[~applies]
    assert (torch.isnan(idle) | (idle == 0)).all(), f"{name}: a signal where no reward applies"   # gd2po: 0
    if name not in DROPS_MEDIAN:
        assert torch.isfinite(adv[applies]).all(), f"{name}: NaN advantage for R={R.tolist()}"
    return True


@pytest.mark.parametrize("name", BALANCERS.names())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_balancer_is_finite_or_refuses_clearly(name, problem):
    R, groups, w, gram = problem
    state: dict = {}
    if check_call(name, R, groups, w, state, gram):
        check_call(name, R, groups, w, state, gram)          # stateful balancers: the second call reads state


@pytest.mark.parametrize("name", BALANCERS.names())
def test_empty_batch_gives_empty_advantages(name):
    spec = get_balancer(name)
    R = torch.empty(0, 2)
    adv, _ = spec.balance(R, torch.empty(0, dtype=torch.long), None, {}, spec.Config(),
                          services=FixedGram(torch.eye(2, dtype=torch.float64)))
    assert adv.shape == (0,)


@pytest.mark.parametrize("name", BALANCERS.names())
def test_float32_extremes_give_finite_advantages(name):
    """Finite float32 rewards near 3e38 must not overflow into inf/NaN advantages (the weighted sum did)."""
    spec = get_balancer(name)
    R = torch.tensor([[3e38, 1.0], [-3e38, 2.0], [F32_MAX, 3.0], [1.0, -F32_MAX]], dtype=torch.float32)
    groups = torch.tensor([0, 0, 1, 1])
    adv, _ = spec.balance(R, groups, None, {}, spec.Config(), services=FixedGram(torch.eye(2, dtype=torch.float64)))
    assert torch.isfinite(adv).sum() >= (2 if name in DROPS_MEDIAN else 4), (name, adv)
    assert not torch.isinf(adv).any()


def test_constant_group_with_zero_eps_is_zero_not_nan():
    """eps = 0 divided 0 by 0 for a group whose rewards are all equal (NaN advantages); such a group has no
    signal: A = 0. The balancers' Configs refuse eps ≤ 0 outright (a negative eps flips signs)."""
    r, g = torch.tensor([1.0, 1.0, 2.0, 5.0]), torch.tensor([0, 0, 1, 1])
    torch.testing.assert_close(group_advantages(r, g, std="group", eps=0.0), torch.tensor([0.0, 0.0, -1.0, 1.0]))
    assert torch.equal(group_advantages(torch.ones(3), torch.zeros(3, dtype=torch.long), eps=0.0), torch.zeros(3))
    assert torch.equal(batch_normalize(torch.full((3,), 7.0), eps=0.0), torch.zeros(3))
    with pytest.raises(ValueError, match="eps must be ≥ 0"):
        group_advantages(r, g, eps=-1.0)
    for name in ("weighted_sum", "gdpo", "sa_mrpo", "dara", "gd2po", "marble"):
        for bad in (0.0, -1.0):
            with pytest.raises(ValueError, match="eps must be > 0"):
                get_balancer(name).Config(eps=bad)


@pytest.mark.parametrize("name", [n for n in BALANCERS.names()
                                  if "eps" in {f.name for f in dataclasses.fields(get_balancer(n).Config)}])
@pytest.mark.parametrize("eps", ["0", "-1"])
def test_every_balancers_eps_is_checked_when_the_config_loads(name, eps):
    from flowrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"advantage\.balancer\.eps: .*must be > 0"):
        load_config(None, [f"advantage.balancer={{kind: {name}, eps: {eps}}}"])


def test_balancer_std_typo_is_refused_by_the_config_loader():
    from flowrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"advantage\.balancer\.std: expected one of .*did you mean 'group'"):
        load_config(None, ["advantage.balancer.std=gruop"])
    with pytest.raises(ConfigError, match=r"advantage\.balancer\.eps: .*must be > 0, got -1.0"):
        load_config(None, ["advantage.balancer.eps=-1"])
