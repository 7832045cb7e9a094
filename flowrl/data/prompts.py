"""Prompt datasets for the RL loop: a reproducible stream of (prompt, metadata) batches.

``batch(iteration, n)`` is a pure function of (source, seed, iteration), so the data position after a resume is
simply the iteration counter and every process computes the same global prompt list (no distributed data
"sampler" object is needed: each process takes its slice of the samples, see
``flowrl.distributed.processes.local_slice``).

Sources (``data.train`` / ``data.eval`` in the config):
- ``shapes:train`` / ``shapes:heldout`` — the built-in shapes world (``flowrl.data.shapes``), with metadata the
  verifier rewards read;
- ``video_shapes:train`` / ``video_shapes:heldout`` — the moving-shapes world (``flowrl.data.video_shapes``), with
  the metadata the ``video_shapes`` verifier reads (skill, objects with colour, shape, direction, speed, bounce);
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

WORLDS = ("shapes", "video_shapes")     # the built-in worlds, named as "<world>:<split>" prompt sources


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
    """A built-in world's split (``world``: "shapes" images or "video_shapes" videos): training batches balanced
    over skills; evaluation a fixed balanced set."""

    def __init__(self, split: str, seed: int = 0, world: str = "shapes"):
        if world == "video_shapes":
            from flowrl.data.video_shapes import VideoShapesPrompts as Stream
            from flowrl.data.video_shapes import prompt_list
        else:
            from flowrl.data.shapes import ShapesPrompts as Stream
            from flowrl.data.shapes import prompt_list

        self.stream = Stream(split, seed=seed)
        self.split, self.world = split, world
        self._all = prompt_list(split)

    def __len__(self) -> int:
        return len(self._all)

    def batch(self, iteration: int, n: int) -> list[tuple[str, dict]]:
        return self.stream.batch(iteration, n)

    def eval_metrics(self) -> dict:
        """Extra per-image evaluation scores of this dataset: the shapes world's image-quality figure
        ``palette_distance`` (mean pixel distance to the nearest palette colour; lower is cleaner; videos: the mean
        over frames)."""
        from flowrl.data.shapes.detect import palette_distance

        return {"palette_distance": lambda batch: palette_distance(batch.pixels)}

    def fixed(self, n: int | None) -> list[tuple[str, dict]]:
        """All held-out prompts (n=None), or ``n`` spread evenly over them. Images: evenly over the whole list;
        videos (whose skills differ 3× in size, so an even spread can miss one): ⌈n / skills⌉ evenly within each
        skill, taken skill by skill in turn, so every skill is represented once n ≥ 7."""
        if n is None or n >= len(self._all):
            return list(self._all)
        if self.world == "shapes":
            idx = np.linspace(0, len(self._all) - 1, n).round().astype(int)
            return [self._all[i] for i in idx]
        from flowrl.data.video_shapes import split_by_skill

        groups = list(split_by_skill(self.split).values())
        per = -(-n // len(groups))
        spread = [[g[i] for i in np.linspace(0, len(g) - 1, min(per, len(g))).round().astype(int)] for g in groups]
        turns = [items[k] for k in range(per) for items in spread if k < len(items)]
        return turns[:n]


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
    world, _, split = source.partition(":")
    if world in WORLDS and split:
        try:
            return ShapesSource(split, seed, world)
        except ValueError as e:
            raise PromptError(f"prompt source {source!r}: {e}") from None
    path = Path(source)
    if not path.is_file():
        raise PromptError(f"prompt source {source!r}: no such file; give 'shapes:train', 'shapes:heldout', "
                          "'video_shapes:train', 'video_shapes:heldout', "
                          "a .txt file (one prompt per line) or a .jsonl file with a 'prompt' key")
    if path.suffix == ".jsonl":
        return ListPrompts(_read_jsonl(path), seed, source)
    return ListPrompts(_read_txt(path), seed, source)
