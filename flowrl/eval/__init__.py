"""Evaluation: fixed prompts × seeds → ODE samples → per-image rewards → grids, metrics.jsonl, index.html.

    >>> from flowrl.eval import run_eval
    >>> metrics = run_eval({"base": (policy, None), "trained": (policy, "train")}, prompts, metas, [0, 1],
    ...                    reward_set, "runs/x/eval/step_00000100", steps=20, height=512, width=512)

See docs/evaluation.md for the file layout and the logged metric names.
"""
from flowrl.eval.gallery import GalleryEntry, render_gallery, write_gallery
from flowrl.eval.grid import make_grid, to_uint8
from flowrl.eval.media import save_png, save_video
from flowrl.eval.plots import plot_metrics, plot_run
from flowrl.eval.run import EvalResult, eval_metric_names, generate, run_eval, write_grids
from flowrl.eval.sample import EVAL_ITERATION, ode_sample

__all__ = [
    "EVAL_ITERATION",
    "EvalResult",
    "GalleryEntry",
    "eval_metric_names",
    "generate",
    "make_grid",
    "ode_sample",
    "plot_metrics",
    "plot_run",
    "render_gallery",
    "run_eval",
    "save_png",
    "save_video",
    "to_uint8",
    "write_gallery",
    "write_grids",
]
