"""Benchmarks, each measured side by side in one run: ``python scripts/bench.py NAME [args]``.

Each benchmark is the module ``flowrl.bench.benchmarks.<name>`` (dashes become underscores) and exposes
``main(argv: list[str]) -> dict``; this entry point prints that dict as the last line, one JSON object.
Results and their interpretation go into ``docs/BENCHMARKS.md``.
"""
from __future__ import annotations

import json
import sys

from flowrl.bench import available, load


def main(argv: list[str]) -> None:
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__.strip() + "\n\nAvailable: " + ", ".join(available()))
        return
    result = load(argv[0]).main(argv[1:])
    print(json.dumps(result, sort_keys=False))


if __name__ == "__main__":
    main(sys.argv[1:])
