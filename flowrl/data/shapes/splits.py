"""Fixed train / held-out split of the shapes grammar, and the prompt-dataset API the trainer uses.

Per skill, a fixed seeded permutation (seed 2024) holds out 20 % of that skill's prompts (at least 5, at most
40, so relations — 720 of the 960 prompts — do not swamp the held-out set): 5 colour, 9 counting, 12 position,
24 binding and 40 relation prompts, 90 in all. The held-out prompts are compositions (colour–shape,
colour–shape–count, colour–shape–position, pairings, relations) that never appear as training prompts,
although each word does. The split is a pure function of
the grammar, so it never changes between runs or machines.
"""
from __future__ import annotations

from flowrl.data.shapes.grammar import all_prompts, phrase
from flowrl.data.shapes.world import SKILLS
from flowrl.data.skill_split import SPLITS, SkillSplit, SplitPrompts

SPLIT_SEED = 2024
GRAMMAR = SkillSplit("shapes", all_prompts, phrase, SKILLS, SPLIT_SEED)
__all__ = ["GRAMMAR", "SPLITS", "ShapesPrompts", "prompt_list", "sample_prompts", "split_by_skill"]


def split_by_skill(split: str) -> dict[str, list[tuple[str, dict]]]:
    """{skill: [(prompt, meta), ...]} of ``split`` ("train" | "heldout") in a fixed order."""
    return GRAMMAR.by_skill(split)


def prompt_list(split: str) -> list[tuple[str, dict]]:
    """Every (prompt, meta) of ``split``, skills concatenated in SKILLS order."""
    return GRAMMAR.prompt_list(split)


def sample_prompts(split: str, n: int, seed: int = 0, skills: tuple[str, ...] = SKILLS
                   ) -> list[tuple[str, dict]]:
    """``n`` (prompt, meta) pairs of ``split``, balanced over ``skills``, reproducible from ``seed``
    (``SkillSplit.sample``)."""
    return GRAMMAR.sample(split, n, seed, skills)


class ShapesPrompts(SplitPrompts):
    """A reproducible stream of (prompt, meta) batches from one split (``SplitPrompts``)."""

    grammar = GRAMMAR
