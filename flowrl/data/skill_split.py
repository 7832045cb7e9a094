"""A fixed train / held-out split of a prompt grammar by skill, and the prompt-dataset API the trainer uses; shared
by the image shapes world (``flowrl.data.shapes.splits``) and the moving-shapes world
(``flowrl.data.video_shapes.splits``).

Per skill k, a permutation drawn from ``(seed, k)`` holds out round(20 %) of that skill's prompts, at least 5 and
at most 40. The held-out prompts are compositions never used as training prompts; the split is a pure function of
the grammar, so it never changes between runs or machines.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np

SPLITS = ("train", "heldout")
HELDOUT_FRACTION = 0.2
HELDOUT_MIN = 5
HELDOUT_MAX = 40


class SkillSplit:
    """The split of one grammar: ``all_prompts()`` → {skill: [meta, ...]}, ``phrase(meta)`` → prompt text."""

    def __init__(self, world: str, all_prompts: Callable[[], dict], phrase: Callable[[dict], str],
                 skills: tuple[str, ...], seed: int):
        self.world, self.all_prompts, self.phrase, self.skills, self.seed = world, all_prompts, phrase, skills, seed

    @cached_property
    def indices(self) -> dict[str, dict[str, tuple[int, ...]]]:
        out: dict[str, dict[str, tuple[int, ...]]] = {"train": {}, "heldout": {}}
        for k, (skill, metas) in enumerate(self.all_prompts().items()):
            perm = np.random.default_rng([self.seed, k]).permutation(len(metas))
            n_held = min(HELDOUT_MAX, max(HELDOUT_MIN, round(HELDOUT_FRACTION * len(metas))))
            out["heldout"][skill] = tuple(sorted(perm[:n_held].tolist()))
            out["train"][skill] = tuple(sorted(perm[n_held:].tolist()))
        return out

    @cached_property
    def _by_skill(self) -> dict[str, dict[str, tuple[tuple[str, dict], ...]]]:
        metas = self.all_prompts()
        return {split: {s: tuple((self.phrase(metas[s][i]), metas[s][i]) for i in self.indices[split][s])
                        for s in self.skills} for split in SPLITS}

    def check(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown {self.world} split {split!r}; expected one of {SPLITS}")

    def by_skill(self, split: str) -> dict[str, list[tuple[str, dict]]]:
        """{skill: [(prompt, meta), ...]} of ``split`` ("train" | "heldout") in a fixed order."""
        self.check(split)
        return {s: list(v) for s, v in self._by_skill[split].items()}

    def prompt_list(self, split: str) -> list[tuple[str, dict]]:
        """Every (prompt, meta) of ``split``, skills concatenated in skill order."""
        return [pm for items in self.by_skill(split).values() for pm in items]

    def sample(self, split: str, n: int, seed: int = 0, skills: tuple[str, ...] | None = None
               ) -> list[tuple[str, dict]]:
        """``n`` (prompt, meta) pairs of ``split``, balanced over ``skills`` (skill i % len(skills) for row i,
        order shuffled), each prompt drawn uniformly within its skill; reproducible from ``seed``."""
        skills = self.skills if skills is None else skills
        unknown = [s for s in skills if s not in self.skills]
        if unknown:
            raise ValueError(f"unknown {self.world} skills {unknown}; expected a subset of {self.skills}")
        self.check(split)
        by_skill = self._by_skill[split]
        rng = np.random.default_rng([seed, SPLITS.index(split)])
        out = []
        for i in rng.permutation(n):
            items = by_skill[skills[i % len(skills)]]
            out.append(items[rng.integers(len(items))])
        return out


class SplitPrompts:
    """A reproducible stream of (prompt, meta) batches from one split (the trainer's prompt dataset): ``batch(i,
    n)`` is a pure function of (split, seed, i), so iteration i gets the same prompts on resume."""

    grammar: SkillSplit            # set by the world's subclass

    def __init__(self, split: str = "train", seed: int = 0, skills: tuple[str, ...] | None = None):
        self.grammar.check(split)
        self.split, self.seed = split, seed
        self.skills = tuple(self.grammar.skills if skills is None else skills)

    def __len__(self) -> int:
        return sum(len(v) for k, v in self.grammar.by_skill(self.split).items() if k in self.skills)

    def batch(self, iteration: int, n: int) -> list[tuple[str, dict]]:
        return self.grammar.sample(self.split, n, seed=self.seed * 1_000_003 + iteration, skills=self.skills)
