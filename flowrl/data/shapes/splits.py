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

split_by_skill = GRAMMAR.by_skill      # {skill: [(prompt, meta), ...]} of a split, fixed order
prompt_list = GRAMMAR.prompt_list      # every (prompt, meta) of a split, skills in SKILLS order
sample_prompts = GRAMMAR.sample        # n (prompt, meta) balanced over skills, reproducible from a seed


class ShapesPrompts(SplitPrompts):
    """A reproducible stream of (prompt, meta) batches from one split (``SplitPrompts``)."""

    grammar = GRAMMAR
