"""Benchmarks, each measured side by side in one run: ``python scripts/bench.py NAME [args]``.

Each benchmark lives in ``scripts/benchmarks/<name>.py`` (dashes become underscores) and exposes
``main(argv: list[str]) -> dict``; this dispatcher prints that dict as the last line, one JSON object.
Results and their interpretation go into ``docs/BENCHMARKS.md``.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "benchmarks"


def available() -> list[str]:
    return sorted(p.stem.replace("_", "-") for p in HERE.glob("*.py") if not p.stem.startswith("_"))


def load(name: str):
    path = HERE / f"{name.replace('-', '_')}.py"
    if not path.is_file():
        import difflib

        hint = difflib.get_close_matches(name, available(), n=1)
        msg = f"unknown benchmark {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
        raise SystemExit(f"{msg} Available: {', '.join(available())}")
    spec = importlib.util.spec_from_file_location(f"flowrl_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> None:
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__.strip() + "\n\nAvailable: " + ", ".join(available()))
        return
    result = load(argv[0]).main(argv[1:])
    print(json.dumps(result, sort_keys=False))


if __name__ == "__main__":
    main(sys.argv[1:])
