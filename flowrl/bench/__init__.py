"""The benchmark lab: ``python scripts/bench.py NAME [args]`` runs ``flowrl.bench.benchmarks.<name>``.

Each benchmark is a module of :mod:`flowrl.bench.benchmarks` (dashes in NAME become underscores) exposing
``main(argv: list[str]) -> dict``. The shared machinery lives beside this file, one concept a module:

- ``learning_lib``: train a recipe once per seed with a fixed held-out evaluation, the "before" and finished-run
  caches keyed by ``code_digest``; re-exports ``learning_stats`` (mean ± SE, NFE budgets) and the plots.
- ``learning_plot``: the learning / tree / pool / balancer figures (matplotlib, the ``plots`` extra).
- ``hacking_carry`` / ``hacking_figures``: carrying hacking-benchmark results across runs, and its figures.
- ``faults`` / ``server_load``: kill-and-resume, bad-config and reward-server-load drivers (reliability).
- ``paths``: paths as recorded in committed results (relative to the repository root).

The lab reads ``configs/`` and writes ``runs/`` and ``docs/benchmarks/`` of a repository checkout (``REPO``).
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from flowrl.bench.paths import REPO

__all__ = ["REPO", "available", "load"]


def available() -> list[str]:
    """The benchmark names ``scripts/bench.py`` accepts (module names with dashes)."""
    from flowrl.bench import benchmarks

    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(benchmarks.__path__)
                  if not m.name.startswith("_"))


def load(name: str) -> ModuleType:
    """The benchmark module for ``name`` (``toy-baseline`` → ``flowrl.bench.benchmarks.toy_baseline``)."""
    names = available()
    if name.replace("_", "-") not in names:
        import difflib

        hint = difflib.get_close_matches(name, names, n=1)
        msg = f"unknown benchmark {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
        raise SystemExit(f"{msg} Available: {', '.join(names)}")
    return importlib.import_module(f"flowrl.bench.benchmarks.{name.replace('-', '_')}")
