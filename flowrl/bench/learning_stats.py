"""Statistics of the learning benchmarks: mean ± standard error over seeds, the standard error of one evaluation
(binomial, bootstrap over prompts), first-reach interpolation on curves, and ``aggregate`` over runs.

Pure functions on numbers and the plain dicts ``learning_lib.run_recipe`` returns; ``learning_lib`` re-exports
them (load that module, not this one).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

PER_PROMPT = ("strict", "partial")          # scores kept per prompt for the bootstrap standard errors
BOOTSTRAP_REPS = 2000
COUNTERS = ("iteration", "rollout_nfe", "train_nfe", "wall_s", "train_cpu_s", "eval_s", "eval_cpu_s",
            "num_prompts", "num_seeds")     # bookkeeping fields of a curve point: no gains are taken of them


def finite(v) -> float | None:
    """``float(v)``, or None when missing or not finite (JSON has no NaN)."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def mean_se(values: Iterable) -> tuple[float | None, float | None]:
    """(mean, standard error s/√n with s the n − 1 standard deviation) of the finite values; SE None for n < 2."""
    x = np.asarray([v for v in (finite(v) for v in values) if v is not None], dtype=np.float64)
    if x.size == 0:
        return None, None
    return float(x.mean()), (float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else None)


def binomial_se(p: float | None, n: int) -> float | None:
    """Standard error sqrt(p(1 − p)/n) of a proportion p measured on n independent images."""
    if p is None or n < 1:
        return None
    return math.sqrt(max(p * (1.0 - p), 0.0) / n)


def bootstrap_se(per_prompt: Sequence[float], reps: int = BOOTSTRAP_REPS, seed: int = 0) -> float | None:
    """Bootstrap standard error of the mean over prompts: the std (ddof 1) of ``reps`` means of P prompt values
    drawn with replacement (Efron & Tibshirani 1993, ch. 6). With equal seeds per prompt the mean of the prompt
    means is the evaluation's mean, so this is its SE with the images of one prompt kept together."""
    x = np.asarray(per_prompt, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return None
    idx = np.random.default_rng(seed).integers(0, x.size, size=(reps, x.size))
    return float(x[idx].mean(axis=1).std(ddof=1))


def nfe_to_reach(curve: Sequence, target: float, *, x: str = "rollout_nfe", y: str = "strict") -> float | None:
    """The ``x`` at which a curve first reaches ``target``, linear between evaluations; None if it never does.

    ``curve``: (x, y) pairs, or dicts holding ``x``/``y`` (or ``x_mean``/``y_mean``, as ``aggregate`` gives).
    A curve that starts at or above the target reaches it at its first x."""
    pts = [_xy(p, x, y) for p in curve]
    pts = [(a, b) for a, b in pts if a is not None and b is not None]
    if pts and pts[0][1] >= target:
        return pts[0][0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if y1 >= target:
            return x0 + (x1 - x0) * (target - y0) / (y1 - y0)
    return None


def _xy(point, x: str, y: str) -> tuple[float | None, float | None]:
    if isinstance(point, dict):
        return (finite(point.get(x, point.get(f"{x}_mean"))), finite(point.get(y, point.get(f"{y}_mean"))))
    return finite(point[0]), finite(point[1])


def nfe_ratio(reference: dict, candidate: dict, metric: str = "strict", gain: bool = False) -> float | None:
    """reference's final rollout NFEs ÷ the NFEs ``candidate`` needs to first reach reference's final mean
    ``metric`` (both ``aggregate`` results, on the mean curves); None when never reached or reached at 0 NFEs.
    With ``gain``, both curves are measured from their own first point (for methods evaluated at different
    guidance, whose starting accuracies differ)."""
    target = reference["after"].get(f"{metric}_mean")
    if target is None:
        return None
    curve = candidate["curve"]
    if gain:
        target -= reference["curve"][0][f"{metric}_mean"]
        start = curve[0][f"{metric}_mean"]
        curve = [{**p, f"{metric}_mean": p[f"{metric}_mean"] - start} for p in curve]
    reach = nfe_to_reach(curve, target, y=metric)
    budget = reference["after"].get("rollout_nfe_mean")
    return budget / reach if reach and budget else None


def aggregate(runs: Sequence[dict]) -> dict:
    """Mean and standard error over seeds of every numeric field at each evaluation point, and of the gains.

    ``runs``: ``run_recipe`` results of one method (same iterations and eval points). Returns
    {"seeds", "n", "curve": [{"iteration", "<field>_mean", "<field>_se", ...}] at every iteration evaluated in
    all runs, "before" and "after" (its first and last points), "gain": {"<field>_mean", "<field>_se"} of the
    per-run after − before, "gain_se_eval": {metric: mean over runs of the paired within-evaluation SE}}."""
    if not runs:
        raise ValueError("aggregate: no runs given")
    steps = sorted(set.intersection(*({p["iteration"] for p in r["curve"]} for r in runs)))
    curve = [_mean_point([_at(r, it) for r in runs], it) for it in steps]
    gains = [{k: _diff(r["after"].get(k), r["before"].get(k)) for k in r["after"]
              if k not in COUNTERS and "_se_" not in k} for r in runs]
    gain = {}
    for k in sorted({k for g in gains for k in g}):
        gain[f"{k}_mean"], gain[f"{k}_se"] = mean_se(g.get(k) for g in gains)
    eval_se = {m: mean_se(r.get("gain_se_eval", {}).get(m) for r in runs)[0] for m in PER_PROMPT}
    return {"seeds": [r.get("seed") for r in runs], "n": len(runs), "curve": curve, "before": curve[0],
            "after": curve[-1], "gain": gain, "gain_se_eval": eval_se}


def _at(run: dict, iteration: int) -> dict:
    return next(p for p in run["curve"] if p["iteration"] == iteration)


def _diff(a, b) -> float | None:
    a, b = finite(a) if _is_number(a) else None, finite(b) if _is_number(b) else None
    return None if a is None or b is None else a - b


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _mean_point(points: list[dict], iteration: int) -> dict:
    out: dict = {"iteration": iteration}
    for k in sorted({k for p in points for k in p if k != "iteration" and _is_number(p.get(k))}):
        out[f"{k}_mean"], out[f"{k}_se"] = mean_se(p.get(k) for p in points)
    return out
