"""Evaluation: fixed prompts × seeds → ODE samples → per-image rewards → grids, metrics.jsonl, index.html.

    >>> from flowrl.eval import run_eval
    >>> metrics = run_eval({"base": (policy, None), "trained": (policy, "train")}, prompts, metas, [0, 1],
    ...                    reward_set, "runs/x/eval/step_00000100", steps=20, height=512, width=512)

See docs/evaluation.md for the file layout and the logged metric names.
"""
from flowrl.eval.detectors import image_statistics
from flowrl.eval.diversity import prompt_diversity, seed_diversity
from flowrl.eval.drift import DEFAULT_BANDS, DriftBand, drift_alarms, drift_checks
from flowrl.eval.gallery import GalleryEntry, render_gallery, write_gallery
from flowrl.eval.grid import make_grid, to_uint8
from flowrl.eval.media import save_png, save_video
from flowrl.eval.monitors import policy_summary
from flowrl.eval.plots import plot_metrics, plot_run
from flowrl.eval.run import EvalResult, eval_metric_names, generate, run_eval, write_grids
from flowrl.eval.sample import EVAL_ITERATION, ode_sample

__all__ = [
    "DEFAULT_BANDS",
    "EVAL_ITERATION",
    "DriftBand",
    "EvalResult",
    "GalleryEntry",
    "drift_alarms",
    "drift_checks",
    "eval_metric_names",
    "generate",
    "image_statistics",
    "make_grid",
    "ode_sample",
    "plot_metrics",
    "plot_run",
    "policy_summary",
    "prompt_diversity",
    "render_gallery",
    "run_eval",
    "save_png",
    "save_video",
    "seed_diversity",
    "to_uint8",
    "write_gallery",
    "write_grids",
]
