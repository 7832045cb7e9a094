"""The plugin contracts hold (``flowrl.contracts``): the core names and sniffs no plugin, and every registered
objective, balancer, reward, scout and rollout strategy satisfies its Protocol.

(a) In the core (``flowrl/training/``, ``flowrl/distributed/``, ``flowrl/distill/trainer.py``) no string literal
is a plugin's name (``"fp4"``, ``"marble"``, ``"ode"``, ``"flow_sde"``, in either quotes), and there is no
``hasattr(`` at all: an optional part of a plugin is a declared capability flag or a hook with a default, never
a question the core asks. Read with ``tokenize``, so a name mentioned in a docstring or comment is fine and a
literal is found wherever it stands. ``ALLOWED_HASATTR`` lists justified non-plugin uses (none today).
(b) Every registry entry against its Protocol, and a plugin missing a part of its contract is refused.
"""
from __future__ import annotations

import ast
import io
import sys
import tokenize
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CORE = sorted([*(REPO / "flowrl/training").rglob("*.py"), *(REPO / "flowrl/distributed").rglob("*.py"),
               REPO / "flowrl/distill/trainer.py"])
PLUGIN_NAMES = {"fp4", "marble", "ode", "flow_sde"}
ALLOWED_HASATTR: dict[str, str] = {}     # "path:line" → why this is not a question about a plugin


def sniffs(path: Path) -> list[str]:
    """``path:line: what`` for every plugin-name literal and every ``hasattr(`` call in ``path``."""
    rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    out = []
    toks = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    for i, tok in enumerate(toks):
        where = f"{rel}:{tok.start[0]}"
        if tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):       # f-strings: their literal parts hold no bare name
                continue
            if isinstance(value, str) and value in PLUGIN_NAMES:
                out.append(f"{where}: plugin name literal {tok.string}")
        elif (tok.type == tokenize.NAME and tok.string == "hasattr" and i + 1 < len(toks)
              and toks[i + 1].string == "(" and where not in ALLOWED_HASATTR):
            out.append(f"{where}: hasattr(...) sniff: {tok.line.strip()}")
    return out


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_core_names_and_sniffs_no_plugin(path):
    found = sniffs(path)
    assert not found, "the core names or sniffs a plugin (declare a capability in flowrl/contracts.py instead):\n" \
                      + "\n".join(found)


def test_the_sniff_scan_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text('"""the \'ode\' kernel in a docstring is fine"""\n'
                   'k = "ode" if hasattr(x, "resume") else \'fp4\'\n# "marble" in a comment\n')
    found = sniffs(bad)
    assert [f.split(": ", 1)[1].split(" ")[0] for f in found] == ["plugin", "hasattr(...)", "plugin"]
    assert all(f.startswith("probe.py:2: ") for f in found)


# ----------------------------------------------------------------------------------------------- objectives

def objective_names():
    from flowrl.objectives import OBJECTIVES

    return sorted(OBJECTIVES.names())


@pytest.mark.parametrize("name", objective_names())
def test_every_objective_meets_the_objective_protocol(name):
    from flowrl.contracts import OBJECTIVE_MODULE, Objective, SampleSource, missing
    from flowrl.objectives import get_objective

    spec = get_objective(name)
    assert isinstance(spec, Objective)
    assert not missing(sys.modules[spec.loss.__module__], OBJECTIVE_MODULE)
    cfg = spec.Config()
    for source in (spec.TRAINS_ON, get_objective(name, cfg).TRAINS_ON):
        assert isinstance(source, SampleSource) and isinstance(source.stores_trajectory, bool)
    assert callable(spec.prepare_advantages) and callable(spec.end_iteration)
    assert 0.0 <= spec.old_decay(cfg, 0) <= 1.0


def test_an_objective_module_without_its_source_is_refused(monkeypatch):
    from flowrl.objectives import get_objective

    mod = types.ModuleType("_contract_probe_objective")
    mod.loss = lambda policy, batch, cfg: None
    mod.loss.__module__ = mod.__name__

    @dataclass
    class Config:
        old_update: str = "on_policy"

    mod.Config = Config
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    with pytest.raises(TypeError, match="must define TRAINS_ON"):
        get_objective(f"{mod.__name__}:loss")


# ------------------------------------------------------------------------------------------------ balancers

def balancer_names():
    from flowrl.balancers import BALANCERS

    return sorted(BALANCERS.names())


class RefusingServices:
    """Counts the requests and answers with the identity Gram."""

    def __init__(self):
        self.calls = 0

    def reward_gram(self, A_k):
        self.calls += 1
        return torch.eye(A_k.shape[1], dtype=torch.float64)


@pytest.mark.parametrize("name", balancer_names())
def test_every_balancer_meets_the_balancer_protocol_and_asks_only_when_it_says_so(name):
    from flowrl.balancers import get_balancer
    from flowrl.contracts import Balancer

    spec = get_balancer(name)
    assert isinstance(spec, Balancer) and isinstance(spec.needs_reward_gradients, bool)
    R = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.2], [0.1, 0.9], [0.3, 0.3], [0.8, 0.1]])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    services = RefusingServices()
    adv, diag = spec.balance(R, groups, None, {}, spec.Config(), services=services)
    assert adv.shape == (6,) and isinstance(diag, dict)
    assert (services.calls > 0) == spec.needs_reward_gradients      # the first call of a Gram balancer asks


def test_a_balancer_module_without_its_capability_flag_is_refused(monkeypatch):
    from flowrl.balancers import get_balancer

    mod = types.ModuleType("_contract_probe_balancer")

    def balance(R, group_ids, weights=None, state=None, cfg=None, services=None):
        return R[:, 0], {}

    balance.__module__ = mod.__name__
    mod.balance, mod.Config = balance, type("Config", (), {})
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    with pytest.raises(TypeError, match="NEEDS_REWARD_GRADIENTS"):
        get_balancer(f"{mod.__name__}:balance")


# -------------------------------------------------------------------------------------------------- rewards

def reward_names():
    from rewards import REWARDS

    return sorted(REWARDS.names())


@pytest.mark.parametrize("name", reward_names())
def test_every_reward_meets_the_reward_protocols(name):
    from flowrl.contracts import LoadedReward, Reward
    from rewards import REWARDS
    from rewards.base import OPTIONAL_ATTRIBUTES
    from rewards.build import BoundReward

    plugin = REWARDS.get(name)
    assert isinstance(plugin, Reward)
    for attr, kind in OPTIONAL_ATTRIBUTES.items():          # declared or not, never of another type
        declared = getattr(plugin, attr, None)
        assert declared is None or isinstance(declared, kind), f"reward {name}: {attr} must be a {kind.__name__}"
    bound = BoundReward(plugin, name)
    assert isinstance(bound, LoadedReward)
    assert set(bound.accepts) <= {"image", "video"} and isinstance(bound.shapes_world, bool)


def test_shapes_rewards_declare_the_shapes_world():
    from rewards import RewardSet

    assert RewardSet({"shapes": 1.0}).shapes_world
    assert RewardSet({"shapes_count_only": 1.0, "jpeg_compressibility": 0.0}).shapes_world
    assert not RewardSet({"jpeg_compressibility": 1.0}).shapes_world


# ------------------------------------------------------------------------------------- scouts and strategies

def scout_names():
    from flowrl.pools.scouts import SCOUTS

    return sorted(SCOUTS.names())


@pytest.mark.parametrize("name", scout_names())
def test_every_scout_meets_the_scout_protocol(name):
    from flowrl.contracts import Scout
    from flowrl.pools.scouts import SCOUTS

    scout = SCOUTS.get(name)()
    assert isinstance(scout, Scout), f"scout {name}: subclass flowrl.contracts.ScoutBase or declare its parts"
    assert isinstance(scout.resumable, bool) and isinstance(scout.copies_transformer, bool)
    assert scout.resumable or scout.resume([0]) is None


def accelerator_names():
    from flowrl.accelerators import ACCELERATORS

    return sorted(ACCELERATORS.names())


@pytest.mark.parametrize("name", accelerator_names())
def test_every_rollout_accelerator_meets_its_protocol(name):
    from flowrl.accelerators import ACCELERATORS
    from flowrl.contracts import RolloutAccelerator

    acc = ACCELERATORS.get(name)()
    assert isinstance(acc, RolloutAccelerator) and isinstance(acc.lossy, bool)
    assert acc.lossy == (name != "exact")
    assert isinstance(acc.stores_exact_steps, bool) and acc.stores_exact_steps == (name == "exact")


def test_rollout_strategies_meet_the_strategy_protocol():
    from flowrl.contracts import Strategy
    from flowrl.pools.stage import PoolStage
    from flowrl.training.trees import TreeStage

    assert issubclass(TreeStage, Strategy) and issubclass(PoolStage, Strategy)
