"""Every registered reward follows the plugin shape: a class with a name, a dataclass Config whose defaults
construct (the anchor's published values), a declared input kind, and a constructor that loads nothing."""
import dataclasses
import inspect

import pytest

from rewards import REWARDS

BUILTIN = sorted(REWARDS._entries)


@pytest.mark.parametrize("name", BUILTIN)
def test_plugin_shape(name, monkeypatch):
    monkeypatch.setenv("FLOWRL_REWARD_TOKEN", "x")  # the remote client refuses to build without a token
    cls = REWARDS.get(name)
    assert inspect.isclass(cls) and callable(cls)
    assert getattr(cls, "name", None) == name
    assert dataclasses.is_dataclass(cls.Config)
    assert set(getattr(cls, "accepts", ("image", "video"))) <= {"image", "video"}
    reward = cls(cls.Config())
    for attr in ("model", "engine", "inner"):  # weights / engines load in setup(), not in the constructor
        assert getattr(reward, attr, None) is None
    assert (cls.__doc__ or inspect.getmodule(cls).__doc__ or "").strip()
