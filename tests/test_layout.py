"""Import boundaries that keep the rooms honest (DESIGN.md "Rules"), checked by scanning module-level imports.

- ``flowrl/types.py`` imports only torch (and the standard library).
- ``samplers/`` imports only torch, tqdm, ``flowrl.types`` / ``flowrl.registry`` and itself.
- ``rewards/`` imports at module level only torch, numpy, PIL, ``flowrl.types`` / ``flowrl.registry`` and itself;
  model libraries are imported lazily inside functions.
- the ``flowrl`` core reaches a reward or sampler plugin only through the registries (``from rewards import
  REWARDS``), never ``rewards.<plugin>`` / ``samplers.<kernel>`` directly; the sampler infrastructure modules
  (sampling engine, rollout loops, stages, schedules, windows, rng) and the reward composite are shared machinery,
  not plugins.
- ``flowrl/contracts.py`` (the plugin Protocols) imports no plugin: only torch, ``flowrl.balancers.services``
  and ``rewards.base``, so any module may import the contracts.
- every library file (``flowrl/``, ``samplers/``, ``rewards/``, ``scripts/``) is at most 400 lines.
"""
import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
SAMPLER_INFRA = {"samplers", "samplers.engine", "samplers.rollout", "samplers.steps", "samplers.schedule",
                 "samplers.windows", "samplers.rng", "samplers.base", "samplers.log_prob", "samplers.tree",
                 "samplers.restart"}
REWARD_INFRA = {"rewards", "rewards.base", "rewards.compose"}


def module_level_imports(path: Path) -> list[str]:
    """Absolute module names imported at module level (not inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in tree.body:
        nodes = [node]
        if isinstance(node, (ast.If, ast.Try)):
            nodes = list(ast.walk(node))
        for n in nodes:
            if isinstance(n, ast.Import):
                names += [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                names.append(n.module)
    return names


def files(pkg: str) -> list[Path]:
    return sorted((REPO / pkg).rglob("*.py"))


def top(name: str) -> str:
    return name.split(".")[0]


def test_types_imports_only_torch():
    bad = [m for m in module_level_imports(REPO / "flowrl/types.py") if top(m) not in STDLIB | {"torch"}]
    assert not bad, bad


@pytest.mark.parametrize("path", files("samplers"), ids=lambda p: str(p.relative_to(REPO)))
def test_samplers_boundary(path):
    ok = STDLIB | {"torch", "tqdm"}
    bad = [m for m in module_level_imports(path)
           if top(m) not in ok and not m.startswith("samplers") and m not in {"flowrl.types", "flowrl.registry"}]
    assert not bad, f"{path}: samplers/ may import only torch, tqdm and flowrl.types: {bad}"


@pytest.mark.parametrize("path", files("rewards"), ids=lambda p: str(p.relative_to(REPO)))
def test_rewards_boundary(path):
    ok = STDLIB | {"torch", "numpy", "PIL"}
    bad = [m for m in module_level_imports(path)
           if top(m) not in ok and not m.startswith("rewards") and m not in {"flowrl.types", "flowrl.registry"}]
    assert not bad, f"{path}: import model libraries lazily inside setup(): {bad}"


@pytest.mark.parametrize("path", files("flowrl"), ids=lambda p: str(p.relative_to(REPO)))
def test_core_reaches_plugins_through_registries(path):
    bad = []
    for m in module_level_imports(path):
        if top(m) == "samplers" and m not in SAMPLER_INFRA:
            bad.append(m)
        if top(m) == "rewards" and m not in REWARD_INFRA:
            bad.append(m)
    assert not bad, f"{path}: reach plugins via samplers.KERNELS / rewards.REWARDS, not {bad}"


def test_contracts_import_no_plugin():
    ok = STDLIB | {"torch"}
    bad = [m for m in module_level_imports(REPO / "flowrl/contracts.py")
           if top(m) not in ok and m not in {"flowrl.balancers.services", "rewards.base"}]
    assert not bad, f"flowrl/contracts.py must import no plugin: {bad}"


def test_no_package_imports_scripts():
    for pkg in ("flowrl", "samplers", "rewards"):
        for path in files(pkg):
            assert not any(top(m) == "scripts" for m in module_level_imports(path)), path


MAX_FILE_LINES = 400
LIBRARY = ("flowrl", "samplers", "rewards", "scripts")
# Library files allowed over MAX_FILE_LINES: {"path/from/repo/root.py": "why it cannot be split by concept"}.
# Empty today; an entry needs a reason, and an entry whose file is back within the budget fails the test.
LONG_FILES_ALLOWED: dict[str, str] = {}


def test_file_length_budget():
    """One concept a file: every library file is at most MAX_FILE_LINES lines, bar the allow-list."""
    long = {str(p.relative_to(REPO)): n for pkg in LIBRARY for p in files(pkg)
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    over = {p: n for p, n in long.items() if p not in LONG_FILES_ALLOWED}
    assert not over, (f"files over {MAX_FILE_LINES} lines: {over}; split them by concept "
                      "(or, if one truly cannot be split, add it to LONG_FILES_ALLOWED with the reason)")
    stale = sorted(set(LONG_FILES_ALLOWED) - set(long))
    assert not stale, f"LONG_FILES_ALLOWED entries now within {MAX_FILE_LINES} lines or gone; remove them: {stale}"
