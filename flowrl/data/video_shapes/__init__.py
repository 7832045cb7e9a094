"""The moving-shapes world: a built-in text-to-video task with a programmatic verifier (the shapes world in time).

world.py (motion words, speeds, clip record), grammar.py (prompts ↔ metadata), render.py (metadata → clips →
pixels), splits.py (train / held-out prompts), verify.py (videos → tracks → checks). The reward plugin is
rewards/video_shapes.py; see docs/video.md.
"""
from flowrl.data.video_shapes.grammar import all_prompts, parse, phrase, vocabulary
from flowrl.data.video_shapes.render import render_batch, render_clip, render_meta, sample_clip
from flowrl.data.video_shapes.splits import VideoShapesPrompts, prompt_list, sample_prompts, split_by_skill

__all__ = [
           "VideoShapesPrompts",
           "all_prompts",
           "parse",
           "phrase",
           "prompt_list",
           "render_batch",
           "render_clip",
           "render_meta",
           "sample_clip",
           "sample_prompts",
           "split_by_skill",
           "vocabulary",
]
