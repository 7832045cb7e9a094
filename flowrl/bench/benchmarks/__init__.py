"""One module a benchmark, each exposing ``main(argv: list[str]) -> dict`` (``python scripts/bench.py NAME``)."""
