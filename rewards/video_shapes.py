"""Programmatic verifier reward of the moving-shapes world (the shapes verifier in time; docs/video.md).

Each video (B, F, 3, H, W) in [0, 1] is analysed frame by frame with the image world's detector, tracked by
colour, and checked against the prompt's metadata (``batch.meta[i]``; parsed from the prompt when missing) by
``flowrl.data.video_shapes.verify.check_clip``:

    present, extra, consistent (no flicker / identity swap), direction, static, speed, bounce, order, appear
    strict = 1[all applicable checks pass],   partial = mean of the applicable checks.

score = partial (default; graded, for training) or strict (the accuracy to report); sub-scores: every check
(NaN where it does not apply), strict, partial, skill_<skill> (strict where the sample has that skill) and
palette_distance (mean over frames; image quality, 0.003 on ground truth).

``video_shapes_consistency`` is the temporal-consistency check alone as a reward: the fraction of the named
objects tracked with no flicker (a gap or vanishing), no identity swap (shape class change), no jump and no
size change (``verify.check_consistent``); the other checks stay its sub-scores.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from flowrl.types import RewardInput


def _world():
    """The moving-shapes modules, imported lazily (rewards/ imports only torch and flowrl.types eagerly)."""
    from flowrl.data.shapes import detect
    from flowrl.data.video_shapes import grammar, verify
    return detect, grammar, verify


@dataclass
class Config:
    mode: str = "partial"          # "partial" (graded, for training) | "strict" (all-or-nothing accuracy)
    tau: float = 0.25              # max RGB distance of a pixel to its palette colour
    min_area: int = 8              # components below this many px are specks, not objects
    margin: float = 3.0            # least travel of a moving object, px
    drift: float = 2.0             # most sideways wander of a moving object, px
    static_tol: float = 1.5        # most wander of a still object, px
    max_step: float = 5.5          # most centroid jump between frames, px
    max_area_ratio: float = 1.8    # most area change along a track

    def __post_init__(self):
        if self.mode not in ("partial", "strict"):
            raise ValueError(f"video_shapes verifier mode {self.mode!r}; expected 'partial' or 'strict'")


def metas_of(batch: RewardInput) -> list[dict]:
    """Per-sample metadata: ``batch.meta[i]`` when it holds moving-shapes objects, else the parsed prompt."""
    _, grammar, _ = _world()
    out = []
    for i, prompt in enumerate(batch.prompts):
        m = batch.meta[i] if batch.meta and i < len(batch.meta) else None
        out.append(m if m and "objects" in m and m.get("skill") in grammar.SKILLS else grammar.parse(prompt))
    return out


def verify_videos(batch: RewardInput, cfg: Config | None = None) -> dict[str, Tensor]:
    """Every check for a batch of videos as (B,) float tensors, plus skill_<name> and palette_distance."""
    detect, grammar, verify = _world()
    cfg = cfg or Config()
    if batch.pixels.dim() != 5:
        raise ValueError(f"video_shapes takes videos (B, F, 3, H, W), got {tuple(batch.pixels.shape)}")
    tol_names = {f.name for f in fields(verify.Tolerances)}
    tol = verify.Tolerances(**{k: getattr(cfg, k) for k in tol_names})
    metas = metas_of(batch)
    dets = verify.detect_video(batch.pixels, cfg.tau, cfg.min_area)
    rows = [verify.check_clip(d, m, tol, batch.pixels.shape[-1]) for d, m in zip(dets, metas)]
    out = {k: torch.tensor([r[k] for r in rows], dtype=torch.float32) for k in rows[0]}
    for s in grammar.SKILLS:
        out[f"skill_{s}"] = torch.tensor([r["strict"] if m["skill"] == s else math.nan
                                          for r, m in zip(rows, metas)], dtype=torch.float32)
    out["palette_distance"] = detect.palette_distance(batch.pixels.detach().float()).cpu()
    return out


class VideoShapesVerifier:
    """score = partial credit (default) or strict accuracy of moving-shapes videos; sub-scores every check,
    strict, partial, skill_<skill>, palette_distance."""

    Config = Config
    name = "video_shapes"
    accepts = ("video",)

    def __init__(self, cfg: Config | None = None):
        self.cfg = cfg or Config()

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        _world()  # import the analysis code now; it runs on whatever device the pixels are on

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        out = verify_videos(batch, self.cfg)
        return {"score": out[self.cfg.mode].clone(), **out}


class VideoShapesConsistency(VideoShapesVerifier):
    """score = the verifier's temporal-consistency check (mean over the named objects: no flicker, no identity
    swap, no jump); sub-scores as ``video_shapes``."""

    name = "video_shapes_consistency"

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        out = verify_videos(batch, self.cfg)
        return {"score": out["consistent"].clone(), **out}
