"""Periodic / offline evaluation: fixed prompts × fixed seeds, deterministic ODE sampling, per-image rewards,
annotated grids, ``metrics.jsonl`` and an ``index.html`` gallery.

Noise: sample (prompt p, seed s) starts from ``policy.noise([sample_generator(s, EVAL_ITERATION, p, 0)])``
(``samplers.rng``), so every checkpoint and every policy of the same family sees the same starting noise, and
before/after columns differ only by the weights. Sampling is the probability-flow ODE on the policy's own σ grid,
Euler steps ``x' = x + (σ' − σ)·v`` (diffusers FlowMatchEulerDiscreteScheduler), CFG inside
``policy.velocity``, run by the sampling engine (``samplers.engine``) in chunks of ``batch_size`` pairs. The
anchor evaluates the same way (ODE mode, ``eval_num_steps``, ``train_sd3.py``) but keeps no local grids; here
every evaluation writes files.

Output layout of ``out_dir``::

    grid_000.png | grid_000.mp4 | grid_000.gif   rows = prompts (``rows_per_page`` per page),
                                                 columns = seeds × policies (seed-major: base|trained per seed),
                                                 after a "source" column when prompts carry source images
    metrics.jsonl                                one {"kind": "sample", ...} per image, one {"kind": "prompt", ...}
                                                 (seed diversity) per prompt, then {"kind": "summary"}
    index.html                                   the gallery
    samples/<policy>/p0000_s0.png                each image / video alone (``save_samples=True``)

Besides the rewards, every image gets the hacking detectors' statistics (``flowrl.eval.detectors``, scores
``detect/<statistic>``), every policy its seed diversity (``flowrl.eval.diversity``), and, against a base
summary, drift alarms (``flowrl.eval.drift``).
"""
from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from flowrl.data.images import source_images
from flowrl.eval.drift import DriftBand
from flowrl.eval.gallery import GalleryEntry, write_gallery
from flowrl.eval.grid import make_grid, source_tiles, to_uint8
from flowrl.eval.media import VIDEO_FORMATS, save_png, save_video
from flowrl.eval.monitors import (
    COUNT_KEYS,
    DiversitySamples,
    detector_kind,
    detector_scores,
    evaluation_alarms,
)
from flowrl.eval.sample import EVAL_ITERATION

__all__ = ["EvalResult", "eval_metric_names", "run_eval"]

SOURCE = "source"    # the grid column of the prompts' source images

PolicySpec = Any  # Policy | (Policy, adapter name | None) | (Policy, () -> context manager); see _unpack


@dataclass
class EvalResult:
    """Everything one evaluation produced, in memory.

    tiles:  {policy label: uint8 (P, S, [F,] h, w, 3)} (downscaled to ``max_tile``).
    sources: uint8 (P, h, w, 3) each prompt's first source image at the tile size, or None (no prompt has one).
    scores: {policy label: {score name: (P, S) float32}} (NaN = reward does not apply); the image
            statistics are the scores ``detect/<statistic>``.
    diversity: {policy label: {prompt index: seed diversity D_p}} (empty with fewer than two seeds).
    """

    tiles: dict[str, np.ndarray]
    scores: dict[str, dict[str, Tensor]]
    diversity: dict[str, dict[int, float]] = field(default_factory=dict)
    sources: np.ndarray | None = None


def _unpack(spec: PolicySpec):
    """(policy, a function returning a fresh context in which the policy runs the weights to evaluate).

    ``spec`` is a policy (its current weights), ``(policy, adapter name or None)`` (``policy.adapter(name)``),
    or ``(policy, context factory)`` e.g. one that loads checkpoint weights on enter (scripts/evaluate.py).
    """
    if isinstance(spec, tuple):
        policy, how = spec
        if callable(how):
            return policy, how
        return policy, lambda: policy.adapter(how)
    return spec, contextlib.nullcontext


def _score(rewards, pixels: Tensor, prompts: list[str], metas: list[dict], group_ids: Tensor,
           images=None) -> dict[str, Tensor]:
    """Per-image scores ``{name: (n,)}`` from a RewardSet, a mapping name → reward callable, or None."""
    if rewards is None:
        return {}
    from dataclasses import replace

    from rewards.base import make_input, normalize_output

    batch = replace(make_input(pixels.float().clamp(0, 1), prompts, group_ids, metas), images=images)
    if isinstance(rewards, Mapping):
        out = {}
        for name, fn in rewards.items():
            for key, val in normalize_output(fn(batch), len(prompts), name).items():
                out[name if key == "score" else f"{name}/{key}"] = val
        return out
    result = rewards(batch)  # RewardSet → RewardScores
    out = {n: result.scores[:, k] for k, n in enumerate(result.names)}
    out.update(result.sub_scores)
    if len(result.names) > 1:
        out["total"] = result.total
    return out


def _shrink(pixels: Tensor, max_tile: int | None) -> Tensor:
    """Downscale (area, antialiased) so the longer side is ≤ max_tile; grids only, rewards see full size."""
    h, w = pixels.shape[-2:]
    if max_tile is None or max(h, w) <= max_tile:
        return pixels
    scale = max_tile / max(h, w)
    size = (max(1, round(h * scale)), max(1, round(w * scale)))
    flat = pixels.reshape(-1, 3, h, w).float()
    out = torch.nn.functional.interpolate(flat, size=size, mode="bilinear", antialias=True, align_corners=False)
    return out.reshape(*pixels.shape[:-2], *size).clamp(0, 1)


@torch.no_grad()
def generate(policy_spec: PolicySpec, prompts: Sequence[str], metas: Sequence[dict], seeds: Sequence[int],
             rewards, *, steps: int, guidance: float | None, height: int, width: int, num_frames: int | None,
             batch_size: int, max_tile: int | None, on_sample: Callable | None = None,
             negative_prompt: str | None = None, detectors: str | None = None
             ) -> tuple[np.ndarray, dict[str, Tensor]]:
    """Sample every (prompt, seed) of one policy; returns uint8 tiles (P, S, ...) and scores {name: (P, S)}.

    detectors: None, "images" or "shapes": add the image statistics as scores ``detect/<statistic>``
    (``flowrl.eval.monitors.detector_scores``)."""
    from samplers.engine import SampleSpec, SamplingEngine

    policy, adapter_ctx = _unpack(policy_spec)
    P, S = len(prompts), len(seeds)
    pairs = [(p, j) for p in range(P) for j in range(S)]
    w = policy.default_guidance if guidance is None else guidance
    engine = SamplingEngine(policy, SampleSpec(steps, height, width, num_frames, w, negative_prompt))
    tiles: list[np.ndarray] = []
    score_rows: dict[str, list[Tensor]] = {}
    with adapter_ctx():
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start:start + batch_size]
            texts = [prompts[p] for p, _ in chunk]
            images = source_images([metas[p] for p, _ in chunk])
            pixels = engine.sample(texts, [_generator(seeds[j], p) for p, j in chunk], decode=True,
                                   images=images).pixels
            scores = _score(rewards, pixels, texts, [dict(metas[p]) for p, _ in chunk],
                            torch.tensor([p for p, _ in chunk]), images)
            if detectors is not None:
                scores.update(detector_scores(pixels, detectors == "shapes", skip=scores))
            for k, v in scores.items():
                score_rows.setdefault(k, []).append(v.float().cpu())
            tiles.extend(to_uint8(_shrink(pixels, max_tile)))
            if on_sample is not None:
                for i, (p, j) in enumerate(chunk):
                    on_sample(p, seeds[j], pixels[i], {k: float(v[i]) for k, v in scores.items()})
    stacked = np.stack(tiles).reshape(P, S, *tiles[0].shape)
    return stacked, {k: torch.cat(v).reshape(P, S) for k, v in score_rows.items()}


def _generator(seed: int, prompt_idx: int) -> torch.Generator:
    from samplers.rng import sample_generator

    return sample_generator(int(seed), EVAL_ITERATION, int(prompt_idx), 0)


def eval_metric_names(labels: Sequence[str], score_names: Sequence[str]) -> dict[tuple[str, str], str]:
    """(policy label, score) → logged name prefix: ``eval/<score>`` for one policy, else
    ``eval/<label>/<score>``."""
    single = len(labels) == 1
    return {(lab, n): (f"eval/{n}" if single else f"eval/{lab}/{n}") for lab in labels for n in score_names}


def _mean_std(v: Tensor) -> tuple[float, float]:
    ok = v.flatten()[~torch.isnan(v.flatten())]
    return (ok.mean().item(), ok.std(unbiased=False).item()) if ok.numel() else (math.nan, math.nan)


def _summary(result: EvalResult, num_prompts: int, num_seeds: int) -> dict[str, float]:
    """``eval/[<label>/]<score>/{mean,std}`` over prompts × seeds, ``…/diversity/{mean,std}`` over prompts, and
    the evaluation's size ``eval/num_prompts``, ``eval/num_seeds`` (for standard errors)."""
    scores = result.scores
    labels = list(scores)
    names = sorted({n for s in scores.values() for n in s})
    out = {}
    for (lab, n), prefix in eval_metric_names(labels, names).items():
        if n in scores[lab]:
            out[f"{prefix}/mean"], out[f"{prefix}/std"] = _mean_std(scores[lab][n])
    for (lab, _), prefix in eval_metric_names(labels, ["diversity"]).items():
        per_prompt = result.diversity.get(lab)
        if per_prompt:
            out[f"{prefix}/mean"], out[f"{prefix}/std"] = _mean_std(torch.tensor(list(per_prompt.values())))
    out.update(dict(zip(COUNT_KEYS, (float(num_prompts), float(num_seeds)))))
    return out


def _caption(scores: dict[str, Tensor], p: int, j: int, main: Sequence[str]) -> str:
    return "\n".join(f"{n}={scores[n][p, j].item():.3g}" for n in main if n in scores)  # one score per line


def write_grids(result: EvalResult, prompts: Sequence[str], seeds: Sequence[int], out_dir: Path, *,
                rows_per_page: int = 8, video_format: str = "mp4", fps: int = 8) -> list[GalleryEntry]:
    """Pages of rows_per_page prompts; columns (seed j, policy l) seed-major, after a "source" column when the
    prompts carry source images (source | results); returns gallery entries."""
    labels = list(result.tiles)
    main = sorted({n for s in result.scores.values() for n in s if "/" not in n})
    cols = [(j, lab) for j in range(len(seeds)) for lab in labels]
    col_labels = [f"seed {seeds[j]} · {lab}" if len(labels) > 1 else f"seed {seeds[j]}" for j, lab in cols]
    if result.sources is not None:
        result.tiles[SOURCE] = np.repeat(result.sources[:, None], len(seeds), axis=1)
        result.scores[SOURCE] = {}
        cols, col_labels = [(0, SOURCE), *cols], [SOURCE, *col_labels]
    entries = []
    for page, r0 in enumerate(range(0, len(prompts), rows_per_page)):
        rows = list(range(r0, min(r0 + rows_per_page, len(prompts))))
        tiles = np.stack([np.stack([result.tiles[lab][p, j] for j, lab in cols]) for p in rows])
        captions = [[_caption(result.scores[lab], p, j, main) if lab != SOURCE else "" for j, lab in cols]
                    for p in rows]
        row_labels = [f"{p + 1}. {prompts[p]}" for p in rows]
        canvas = make_grid(tiles, row_labels, col_labels, captions if main else None,
                           caption_lines=max(1, min(4, len(main))))
        if canvas.ndim == 4:
            file = save_video(canvas, out_dir / f"grid_{page:03d}.{video_format}", fps=fps)
        else:
            file = save_png(canvas, out_dir / f"grid_{page:03d}.png")
        entries.append(GalleryEntry(file.name, f"prompts {rows[0] + 1}–{rows[-1] + 1}",
                                    [prompts[p] for p in rows], col_labels, first_row=rows[0] + 1))
    if result.sources is not None:
        del result.tiles[SOURCE], result.scores[SOURCE]
    return entries


def _write_jsonl(path: Path, result: EvalResult, prompts, seeds, summary: dict, step: int | None) -> None:
    with open(path, "w") as f:
        for lab, scores in result.scores.items():
            for p in range(len(prompts)):
                for j, seed in enumerate(seeds):
                    vals = {n: _finite(v[p, j].item()) for n, v in scores.items()}
                    f.write(json.dumps({"kind": "sample", "step": step, "policy": lab, "prompt_idx": p,
                                        "prompt": prompts[p], "seed": int(seed), "scores": vals}) + "\n")
            for p, value in sorted(result.diversity.get(lab, {}).items()):
                f.write(json.dumps({"kind": "prompt", "step": step, "policy": lab, "prompt_idx": p,
                                    "prompt": prompts[p], "diversity": _finite(value)}) + "\n")
        f.write(json.dumps({"kind": "summary", "step": step,
                            "metrics": {k: _finite(v) for k, v in summary.items()}}) + "\n")


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _sample_writer(root: Path, label: str, video_format: str, fps: int):
    folder = root / "samples" / label.replace("/", "_")
    folder.mkdir(parents=True, exist_ok=True)

    def write(p: int, seed: int, pixels: Tensor, scores: dict) -> None:
        arr = to_uint8(pixels)
        if arr.ndim == 4:
            save_video(arr, folder / f"p{p:04d}_s{seed}.{video_format}", fps=fps)
        else:
            save_png(arr, folder / f"p{p:04d}_s{seed}.png")
    return write


def run_eval(policies: Mapping[str, PolicySpec], prompts: Sequence[str], metas: Sequence[dict] | None,
             seeds: Sequence[int], rewards, out_dir: str | Path, *, steps: int = 20, guidance: float | None = None,
             height: int = 512, width: int = 512, num_frames: int | None = None, batch_size: int = 8,
             rows_per_page: int = 8, max_tile: int | None = 512, video_format: str = "mp4", fps: int = 8,
             step: int | None = None, title: str | None = None, save_samples: bool = False,
             negative_prompt: str | None = None, detectors: str | None = "auto",
             base_stats: Mapping[str, float] | None = None,
             bands: Mapping[str, DriftBand] | None = None) -> dict[str, float]:
    """Evaluate each policy on prompts × seeds and write grids, metrics.jsonl and index.html into ``out_dir``.

    policies: label → Policy, label → (Policy, adapter name) e.g. {"base": (p, None), "trained": (p, "train")},
              or label → (Policy, context factory) (e.g. ``lambda: checkpoint_weights(p, path)``); evaluated in order.
    negative_prompt: CFG negative prompt when guidance > 1 (None: the policy's default, usually "").
    rewards:  a ``rewards.RewardSet``, a mapping name → reward callable, or None (grids without scores).
    guidance: CFG / distilled guidance scale; None → each policy's ``default_guidance``.
    detectors: image statistics scored as ``detect/<statistic>`` (``flowrl.eval.detectors``): "images" (the
              generic ones), "shapes" (plus the shapes world's), None (none), "auto" ("shapes" when every
              prompt carries shapes-world metadata and the policy makes images, else "images").
    base_stats: the one-policy summary of a base evaluation (e.g. the trainer's "before"): every policy's
              hacking statistics are checked against their bands around it (``flowrl.eval.drift``). When None
              and a policy labelled "base" is evaluated beside others, the "base" column is the reference.
    bands:    {statistic: DriftBand} (default ``flowrl.eval.drift.DEFAULT_BANDS``).
    Returns the summary metrics to log: ``eval/<score>/{mean,std}`` (one policy) or
    ``eval/<label>/<score>/{mean,std}`` (several), where the scores include ``detect/<statistic>``; with two or
    more seeds ``eval/[<label>/]diversity/{mean,std}``; ``eval/num_prompts``, ``eval/num_seeds``; and with a
    reference ``eval/[<label>/]alarm/<statistic>`` (1.0 = out of band), also shown on the gallery page.
    """
    _check_args(policies, prompts, metas, seeds, video_format, batch_size)
    metas = list(metas) if metas is not None else [{} for _ in prompts]
    kind = detector_kind(detectors, metas, num_frames)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = EvalResult({}, {})
    for label, spec in policies.items():
        writer = _sample_writer(out, label, video_format, fps) if save_samples else None
        collect = DiversitySamples() if len(seeds) > 1 else None
        result.tiles[label], result.scores[label] = generate(
            spec, prompts, metas, seeds, rewards, steps=steps, guidance=guidance, height=height, width=width,
            num_frames=num_frames, batch_size=batch_size, max_tile=max_tile, on_sample=_chain(writer, collect),
            negative_prompt=negative_prompt, detectors=kind)
        result.diversity[label] = collect.per_prompt() if collect is not None else {}
    result.sources = source_tiles(source_images(metas), next(iter(result.tiles.values())).shape[2:])
    summary = _summary(result, len(prompts), len(seeds))
    alarms, alarm_lines = evaluation_alarms(summary, list(policies), base_stats, bands)
    summary.update(alarms)
    entries = write_grids(result, prompts, seeds, out, rows_per_page=rows_per_page, video_format=video_format,
                          fps=fps)
    _write_jsonl(out / "metrics.jsonl", result, prompts, seeds, summary, step)
    heading = title or ("evaluation" + (f" at step {step}" if step is not None else ""))
    notes = [f"{len(prompts)} prompts × seeds {list(seeds)}; {steps} ODE steps, guidance "
             f"{'policy default' if guidance is None else guidance}, {height}×{width}"
             + (f"×{num_frames} frames" if num_frames else "")]
    write_gallery(out, heading, entries, _table(result), notes, alarms=alarm_lines)
    return summary


def _table(result: EvalResult) -> dict[str, dict[str, float]]:
    """Gallery table: policy → {score or "diversity": mean}."""
    table = {lab: {n: _nanmean(v) for n, v in s.items()} for lab, s in result.scores.items()}
    for lab, per_prompt in result.diversity.items():
        if per_prompt:
            table[lab]["diversity"] = sum(per_prompt.values()) / len(per_prompt)
    return table


def _chain(*callbacks):
    live = [c for c in callbacks if c is not None]
    if not live:
        return None

    def call(*args) -> None:
        for c in live:
            c(*args)
    return call


def _nanmean(v: Tensor) -> float:
    ok = v[~torch.isnan(v)]
    return ok.mean().item() if ok.numel() else math.nan


def _check_args(policies, prompts, metas, seeds, video_format, batch_size) -> None:
    if not policies:
        raise ValueError("run_eval: no policies given; pass e.g. {'trained': policy}")
    if not prompts:
        raise ValueError("run_eval: the prompt list is empty")
    if not seeds:
        raise ValueError("run_eval: no seeds given; pass e.g. seeds=[0, 1]")
    if metas is not None and len(metas) != len(prompts):
        raise ValueError(f"run_eval: {len(metas)} metadata dicts for {len(prompts)} prompts")
    if video_format not in VIDEO_FORMATS:
        raise ValueError(f"run_eval: video_format {video_format!r}; choose one of {VIDEO_FORMATS}")
    if batch_size < 1:
        raise ValueError(f"run_eval: batch_size must be >= 1, got {batch_size}")
    bad = [lab for lab in policies if not lab or "/" in lab]
    if bad:
        raise ValueError(f"run_eval: policy labels {bad} must be non-empty and contain no '/'")
