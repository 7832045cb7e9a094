"""The Policy Protocol is the contract: every registered family implements every member with the Protocol's
parameters (same names, same order), and a built policy passes ``isinstance(p, Policy)``."""
import inspect

import pytest

from flowrl.policies import POLICIES
from flowrl.policies.base import Policy

MEMBERS = [n for n, v in vars(Policy).items() if callable(v) or isinstance(v, classmethod)
           if not n.startswith("_")]
ATTRIBUTES = ["family", "accepts_images", "device", "dtype", "default_guidance"]


def _params(fn) -> list[str]:
    fn = fn.__func__ if isinstance(fn, classmethod) else fn
    return [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]


def test_protocol_lists_what_the_loop_uses():
    assert {"encode", "noise", "sigmas", "velocity", "decode", "adapter", "trainable_parameters", "copy_adapter",
            "soft_update_adapter", "adapter_state_dict", "load_adapter_state_dict", "from_pretrained",
            "tiny"} <= set(MEMBERS)


@pytest.mark.parametrize("family", sorted(POLICIES.names()))
def test_family_implements_every_member(family):
    cls = POLICIES.get(family)
    for name in MEMBERS:
        impl = inspect.getattr_static(cls, name, None)
        assert impl is not None, f"{family} policy lacks {name}"
        want = _params(vars(Policy)[name])
        got = _params(impl)
        assert got[:len(want)] == want, f"{family}.{name}{got} does not take the Protocol's parameters {want}"


def test_built_policy_is_a_policy():
    policy = POLICIES.get("toy").tiny(seed=0)
    assert isinstance(policy, Policy)
    for name in ATTRIBUTES:
        assert hasattr(policy, name), name
