"""Fixed train / held-out split of the moving-shapes grammar, and the prompt-dataset API (as the image world's).

Per skill, a fixed seeded permutation (seed 2025) holds out 20 % of that skill's prompts, at least 5 and at most
40: 12 motion, 24 speed, 12 bounce, 40 pair, 40 order, 40 appear, 40 sequence = 208 held-out prompts. They are
compositions (colour–shape–direction, –speed, –bounce, pairings, orders) never used as training prompts, made of
words all seen in training. The split is a pure function of the grammar.
"""
from __future__ import annotations

from functools import cache

import numpy as np

from flowrl.data.video_shapes.grammar import all_prompts, phrase
from flowrl.data.video_shapes.world import SKILLS

SPLITS = ("train", "heldout")
HELDOUT_FRACTION = 0.2
HELDOUT_MIN = 5
HELDOUT_MAX = 40
SPLIT_SEED = 2025


@cache
def _split_indices() -> dict[str, dict[str, tuple[int, ...]]]:
    out: dict[str, dict[str, tuple[int, ...]]] = {"train": {}, "heldout": {}}
    for k, (skill, metas) in enumerate(all_prompts().items()):
        perm = np.random.default_rng([SPLIT_SEED, k]).permutation(len(metas))
        n_held = min(HELDOUT_MAX, max(HELDOUT_MIN, round(HELDOUT_FRACTION * len(metas))))
        out["heldout"][skill] = tuple(sorted(perm[:n_held].tolist()))
        out["train"][skill] = tuple(sorted(perm[n_held:].tolist()))
    return out


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown moving-shapes split {split!r}; expected one of {SPLITS}")


@cache
def _by_skill(split: str) -> dict[str, tuple[tuple[str, dict], ...]]:
    metas = all_prompts()
    return {s: tuple((phrase(metas[s][i]), metas[s][i]) for i in _split_indices()[split][s]) for s in SKILLS}


def split_by_skill(split: str) -> dict[str, list[tuple[str, dict]]]:
    """{skill: [(prompt, meta), ...]} of ``split`` ("train" | "heldout") in a fixed order."""
    _check_split(split)
    return {s: list(v) for s, v in _by_skill(split).items()}


def prompt_list(split: str) -> list[tuple[str, dict]]:
    """Every (prompt, meta) of ``split``, skills concatenated in SKILLS order."""
    return [pm for items in split_by_skill(split).values() for pm in items]


def sample_prompts(split: str, n: int, seed: int = 0, skills: tuple[str, ...] = SKILLS
                   ) -> list[tuple[str, dict]]:
    """``n`` (prompt, meta) pairs of ``split``, balanced over ``skills`` (skill i % len(skills) for row i,
    order shuffled), each prompt drawn uniformly within its skill; reproducible from ``seed``."""
    unknown = [s for s in skills if s not in SKILLS]
    if unknown:
        raise ValueError(f"unknown moving-shapes skills {unknown}; expected a subset of {SKILLS}")
    _check_split(split)
    by_skill = _by_skill(split)
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    out = []
    for i in rng.permutation(n):
        items = by_skill[skills[i % len(skills)]]
        out.append(items[rng.integers(len(items))])
    return out


class VideoShapesPrompts:
    """A reproducible stream of (prompt, meta) batches from one split; ``batch(i, n)`` is a pure function of
    (split, seed, i), so iteration i gets the same prompts on resume."""

    def __init__(self, split: str = "train", seed: int = 0, skills: tuple[str, ...] = SKILLS):
        _check_split(split)
        self.split, self.seed, self.skills = split, seed, tuple(skills)

    def __len__(self) -> int:
        return sum(len(v) for k, v in _by_skill(self.split).items() if k in self.skills)

    def batch(self, iteration: int, n: int) -> list[tuple[str, dict]]:
        return sample_prompts(self.split, n, seed=self.seed * 1_000_003 + iteration, skills=self.skills)
