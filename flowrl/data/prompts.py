"""Prompt datasets for the RL loop: a reproducible stream of (prompt, metadata) batches.

``batch(iteration, n)`` is a pure function of (source, seed, iteration), so the data position after a resume is
simply the iteration counter and every process computes the same global prompt list (no distributed data
"sampler" object is needed: each process takes its slice of the samples, see
``flowrl.distributed.processes.local_slice``).

Sources (``data.train`` / ``data.eval`` in the config):
- ``shapes:train`` / ``shapes:heldout`` — the built-in shapes world (``flowrl.data.shapes``), with metadata the
  verifier rewards read;
- ``path/to/prompts.txt`` — one prompt per line (blank lines and ``#`` comments skipped), empty metadata;
- ``path/to/prompts.jsonl`` — one JSON object per line with a ``"prompt"`` key; the other keys become metadata
  (e.g. ``{"prompt": "...", "ocr_text": "..."}`` for the OCR reward). Image-conditioned prompts (editing,
  reference images, image-to-video) add ``"image": "path"`` or ``"images": ["path", ...]``, paths relative to the
  file; they become ``meta["images"]`` (absolute paths, checked to exist), read by ``flowrl.data.images``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


class PromptError(ValueError):
    """A prompt source that cannot be read."""


class ListPrompts:
    """A fixed list of (prompt, meta); training batches draw uniformly with a per-iteration RNG."""

    def __init__(self, items: list[tuple[str, dict]], seed: int = 0, name: str = "prompts"):
        if not items:
            raise PromptError(f"prompt source {name!r} is empty")
        self.items, self.seed, self.name = items, seed, name

    def __len__(self) -> int:
        return len(self.items)

    def batch(self, iteration: int, n: int) -> list[tuple[str, dict]]:
        rng = np.random.default_rng([self.seed, iteration])
        return [self.items[i] for i in rng.integers(0, len(self.items), size=n)]

    def eval_metrics(self) -> dict:
        return {}

    def fixed(self, n: int | None) -> list[tuple[str, dict]]:
        """The first ``n`` items (all when None): the evaluation set, identical for every checkpoint."""
        return list(self.items[: n if n is not None else len(self.items)])


class ShapesSource:
    """The shapes world split: training batches balanced over skills; evaluation a fixed balanced set."""

    def __init__(self, split: str, seed: int = 0):
        from flowrl.data.shapes import ShapesPrompts, prompt_list

        self.stream = ShapesPrompts(split, seed=seed)
        self.split = split
        self._all = prompt_list(split)

    def __len__(self) -> int:
        return len(self._all)

    def batch(self, iteration: int, n: int) -> list[tuple[str, dict]]:
        return self.stream.batch(iteration, n)

    def eval_metrics(self) -> dict:
        """Extra per-image evaluation scores of this dataset: the shapes world's image-quality figure
        ``palette_distance`` (mean pixel distance to the nearest palette colour; lower is cleaner)."""
        from flowrl.data.shapes.detect import palette_distance

        return {"palette_distance": lambda batch: palette_distance(batch.pixels)}

    def fixed(self, n: int | None) -> list[tuple[str, dict]]:
        """All held-out prompts (n=None), or ``n`` spread evenly over them (every skill represented)."""
        if n is None or n >= len(self._all):
            return list(self._all)
        idx = np.linspace(0, len(self._all) - 1, n).round().astype(int)
        return [self._all[i] for i in idx]


def _read_txt(path: Path) -> list[tuple[str, dict]]:
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    return [(ln, {}) for ln in lines if ln and not ln.startswith("#")]


def _read_jsonl(path: Path) -> list[tuple[str, dict]]:
    items = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or "prompt" not in row:
            raise PromptError(f"{path}:{i}: each line must be a JSON object with a 'prompt' key")
        prompt = row.pop("prompt")
        items.append((str(prompt), _image_paths(row, path, i)))
    return items


def _image_paths(row: dict, path: Path, line: int) -> dict:
    """``"image"`` / ``"images"`` of a JSONL row → ``row["images"]``: absolute paths relative to the file."""
    if "image" in row and "images" in row:
        raise PromptError(f"{path}:{line}: give either 'image' (one path) or 'images' (a list), not both")
    if "image" not in row and "images" not in row:
        return row
    given = [row.pop("image")] if "image" in row else row.pop("images")
    if not isinstance(given, list) or not all(isinstance(g, str) for g in given):
        raise PromptError(f"{path}:{line}: 'image' must be a path string and 'images' a list of path strings")
    paths = [(path.parent / g).resolve() for g in given]
    missing = [str(q) for q in paths if not q.is_file()]
    if missing:
        raise PromptError(f"{path}:{line}: source image not found: {missing[0]}")
    row["images"] = [str(q) for q in paths]
    return row


def load_prompts(source: str, seed: int = 0):
    """A prompt dataset from a config string (see the module docstring)."""
    if source.startswith("shapes:"):
        split = source.split(":", 1)[1]
        try:
            return ShapesSource(split, seed)
        except ValueError as e:
            raise PromptError(f"prompt source {source!r}: {e}") from None
    path = Path(source)
    if not path.is_file():
        raise PromptError(f"prompt source {source!r}: no such file; give 'shapes:train', 'shapes:heldout', "
                          "a .txt file (one prompt per line) or a .jsonl file with a 'prompt' key")
    if path.suffix == ".jsonl":
        return ListPrompts(_read_jsonl(path), seed, source)
    return ListPrompts(_read_txt(path), seed, source)
