"""Where the lab reads and writes, and paths as committed results record them.

``REPO`` is the repository checkout the lab runs in (``configs/``, ``runs/``, ``docs/benchmarks/``). A path in a
result is written by :func:`rel`: relative to ``REPO`` when under it, so a committed JSON file holds no absolute
path of the machine that made it; read such a path back with :func:`resolve`.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def rel(path: str | Path, outside: str = "keep") -> str:
    """``path`` relative to the repository root when it lies under it. A path outside the checkout is kept as
    given (``outside="keep"``: e.g. a test's temporary directory) or reduced to its file name (``"name"``: a file
    that is named in a committed result but not located, such as a carried JSON in /tmp)."""
    p = Path(path)
    try:
        return p.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return p.name if outside == "name" else str(p)


def resolve(path: str | Path) -> Path:
    """A path as :func:`rel` wrote it, made absolute again (relative paths are under ``REPO``)."""
    return REPO / path
