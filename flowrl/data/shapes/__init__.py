"""The shapes world: a built-in text-to-image task with a programmatic verifier (GenEval's role, on a CPU).

world.py (palette, grid), render.py (scenes → pixels), grammar.py (prompts ↔ metadata), splits.py (train /
held-out prompts), detect.py (pixels → objects, palette distance). The reward plugins are in rewards/shapes.py.
"""
from flowrl.data.shapes.grammar import all_prompts, parse, phrase, vocabulary
from flowrl.data.shapes.render import render_batch, render_meta, render_scene, sample_scene
from flowrl.data.shapes.splits import ShapesPrompts, prompt_list, sample_prompts, split_by_skill

__all__ = [
           "ShapesPrompts",
           "all_prompts",
           "parse",
           "phrase",
           "prompt_list",
           "render_batch",
           "render_meta",
           "render_scene",
           "sample_prompts",
           "sample_scene",
           "split_by_skill",
           "vocabulary",
]
