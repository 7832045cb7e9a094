"""Fixed train / held-out split of the moving-shapes grammar, and the prompt-dataset API (as the image world's).

Per skill, a fixed seeded permutation (seed 2025) holds out 20 % of that skill's prompts, at least 5 and at most
40: 12 motion, 24 speed, 12 bounce, 40 pair, 40 order, 40 appear, 40 sequence = 208 held-out prompts. They are
compositions (colour–shape–direction, –speed, –bounce, pairings, orders) never used as training prompts, made of
words all seen in training. The split is a pure function of the grammar.
"""
from __future__ import annotations

from flowrl.data.skill_split import SPLITS, SkillSplit, SplitPrompts
from flowrl.data.video_shapes.grammar import all_prompts, phrase
from flowrl.data.video_shapes.world import SKILLS

SPLIT_SEED = 2025
GRAMMAR = SkillSplit("moving-shapes", all_prompts, phrase, SKILLS, SPLIT_SEED)
__all__ = ["GRAMMAR", "SPLITS", "VideoShapesPrompts", "prompt_list", "sample_prompts", "split_by_skill"]

split_by_skill = GRAMMAR.by_skill      # {skill: [(prompt, meta), ...]} of a split, fixed order
prompt_list = GRAMMAR.prompt_list      # every (prompt, meta) of a split, skills in SKILLS order
sample_prompts = GRAMMAR.sample        # n (prompt, meta) balanced over skills, reproducible from a seed


class VideoShapesPrompts(SplitPrompts):
    """A reproducible stream of (prompt, meta) batches from one split (``SplitPrompts``)."""

    grammar = GRAMMAR
