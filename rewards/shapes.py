"""Programmatic verifier rewards of the shapes world (GenEval's role for flowrl's toy task).

Each image is analysed by ``flowrl.data.shapes.detect`` (palette segmentation → 4-connected components →
shape class) and compared with the prompt's metadata ``{"skill", "objects": [{"color", "shape", "count"}],
"position", "relation"}`` (``batch.meta[i]``; parsed from the prompt string when the meta is missing).
Per image the checks are, with M_j the detected objects of spec j's colour and shape:

    present_j = |M_j| ≥ 1,  count_j = (|M_j| = n_j),  extra = (#objects = Σ n_j),
    position  = every object of M_0 lies in the named half (centroid vs the image centre),
    relation  = ∃ a ∈ M_0, b ∈ M_1 displaced the named way by ≥ margin px (half a grid cell),

    strict  = 1[all checks pass] ∈ {0, 1},      partial = mean of the checks ∈ [0, 1].

``ShapesVerifier`` returns the chosen score (default ``partial``: a graded training signal; ``strict`` is the
GenEval-style accuracy to report) plus sub-scores; sub-scores that do not apply to a sample are NaN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.types import RewardInput

SKILLS = ("color", "counting", "position", "binding", "relation")


def _world():
    """The shapes-world modules, imported lazily (rewards/ imports only torch and flowrl.types eagerly)."""
    from flowrl.data.shapes import detect, grammar
    return detect, grammar


@dataclass
class DetectConfig:
    tau: float = 0.25          # max RGB distance of a pixel to its palette colour
    min_area: int = 8          # components below this many px are specks, not objects
    margin: float = 4.0        # relation: centroid displacement in px (half an 8-px grid cell)


@dataclass
class Config(DetectConfig):
    mode: str = "partial"      # "partial" (graded, for training) | "strict" (all-or-nothing accuracy)

    def __post_init__(self):
        if self.mode not in ("partial", "strict"):
            raise ValueError(f"shapes verifier mode {self.mode!r}; expected 'partial' or 'strict'")


@dataclass
class CleanConfig(DetectConfig):
    max_stray: int = 32        # stray pixels at which the clean-background score reaches 0 (~3 % of 32×32)


def metas_of(batch: RewardInput) -> list[dict]:
    """Per-sample metadata: ``batch.meta[i]`` when it holds objects, else the parsed prompt."""
    _, grammar = _world()
    out = []
    for i, prompt in enumerate(batch.prompts):
        m = batch.meta[i] if batch.meta and i < len(batch.meta) else None
        out.append(m if m and "objects" in m else grammar.parse(prompt))
    return out


def _matches(dets, spec) -> list:
    return [d for d in dets if d.color == spec["color"] and d.shape == spec["shape"]]


def _in_half(d, where: str, size: int) -> bool:
    c = (size - 1) / 2
    return {"left": d.cx < c, "right": d.cx > c, "top": d.cy < c, "bottom": d.cy > c}[where]


def _related(a, b, relation: str, margin: float) -> bool:
    return {"above": b.cy - a.cy >= margin, "below": a.cy - b.cy >= margin,
            "left of": b.cx - a.cx >= margin, "right of": a.cx - b.cx >= margin}[relation]


def check_scene(dets, meta: dict, size: int = 32, margin: float = 4.0) -> dict[str, float]:
    """The checks of one image's detections against its metadata: {"present", "count", "extra", "position",
    "relation", "strict", "partial"} (present/count are means over the object specs; NaN = not applicable)."""
    specs = meta["objects"]
    found = [_matches(dets, s) for s in specs]
    present = [float(len(f) >= 1) for f in found]
    count = [float(len(f) == s["count"]) for f, s in zip(found, specs)]
    checks = present + count + [float(len(dets) == sum(s["count"] for s in specs))]
    out = {"present": sum(present) / len(specs), "count": sum(count) / len(specs), "extra": checks[-1],
           "position": math.nan, "relation": math.nan}
    if meta.get("position"):
        out["position"] = float(bool(found[0]) and all(_in_half(d, meta["position"], size) for d in found[0]))
        checks.append(out["position"])
    if meta.get("relation"):
        out["relation"] = float(any(_related(a, b, meta["relation"], margin) for a in found[0] for b in found[1]))
        checks.append(out["relation"])
    out["strict"] = float(all(c == 1.0 for c in checks))
    out["partial"] = sum(checks) / len(checks)
    return out


def _detect(batch: RewardInput, cfg: DetectConfig):
    detect, _ = _world()
    if batch.pixels.dim() != 4:
        raise ValueError(f"shapes rewards take image batches (B, 3, H, W), got {tuple(batch.pixels.shape)}")
    return detect.detect(batch.pixels.detach().float(), tau=cfg.tau, min_area=cfg.min_area)


def verify(batch: RewardInput, cfg: DetectConfig | None = None) -> dict[str, Tensor]:
    """All checks for a batch as (B,) float tensors, plus ``skill_<name>`` = strict where the sample's skill is
    <name> (NaN elsewhere)."""
    cfg = cfg or DetectConfig()
    metas = metas_of(batch)
    rows = [check_scene(d, m, batch.pixels.shape[-1], cfg.margin) for d, m in zip(_detect(batch, cfg), metas)]
    out = {k: torch.tensor([r[k] for r in rows], dtype=torch.float32) for k in rows[0]} if rows else {}
    for s in SKILLS:
        out[f"skill_{s}"] = torch.tensor([r["strict"] if m["skill"] == s else math.nan
                                          for r, m in zip(rows, metas)], dtype=torch.float32)
    return out


class _ShapesReward:
    Config = DetectConfig
    accepts = ("image",)
    shapes_world = True        # the loop logs the palette detectors of the images it scores (rewards/base.py)

    def __init__(self, cfg: DetectConfig | None = None):
        self.cfg = cfg or type(self).Config()

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        _world()  # import the analysis code now; it runs on whatever device the pixels are on


class ShapesVerifier(_ShapesReward):
    """score = partial credit (default) or strict all-constraints accuracy; sub-scores strict, partial,
    present, count, extra, position, relation, skill_<skill>."""

    Config = Config
    name = "shapes"

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        out = verify(batch, self.cfg)
        return {"score": out[self.cfg.mode].clone(), **out}


class CountReward(_ShapesReward):
    """score = mean over object specs of 1 − min(1, |n̂_j − n_j| / n_j), n̂_j the detected objects of the
    spec's colour and shape: graded counting credit."""

    name = "shapes_count"

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        scores = []
        for dets, meta in zip(_detect(batch, self.cfg), metas_of(batch)):
            errs = [min(1.0, abs(len(_matches(dets, s)) - s["count"]) / s["count"]) for s in meta["objects"]]
            scores.append(1.0 - sum(errs) / len(errs))
        return {"score": torch.tensor(scores, dtype=torch.float32)}


class ColorReward(_ShapesReward):
    """score = recall · precision of colours: recall = fraction of the prompt's colours present among the
    detected objects, precision = fraction of detected objects whose colour the prompt names (0 if none)."""

    name = "shapes_color"

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        rec, prec = [], []
        for dets, meta in zip(_detect(batch, self.cfg), metas_of(batch)):
            wanted = {s["color"] for s in meta["objects"]}
            seen = {d.color for d in dets}
            rec.append(len(wanted & seen) / len(wanted))
            prec.append(sum(d.color in wanted for d in dets) / len(dets) if dets else 0.0)
        r, p = torch.tensor(rec), torch.tensor(prec)
        return {"score": r * p, "color_recall": r, "color_precision": p}


class PositionReward(_ShapesReward):
    """score = position skill: fraction of the named objects in the named half; relation skill: 1 if some
    pair stands in the named relation; NaN for prompts without a position or relation."""

    name = "shapes_position"

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        scores = []
        size = batch.pixels.shape[-1]
        for dets, meta in zip(_detect(batch, self.cfg), metas_of(batch)):
            found = [_matches(dets, s) for s in meta["objects"]]
            if meta.get("position"):
                f = found[0]
                scores.append(sum(_in_half(d, meta["position"], size) for d in f) / len(f) if f else 0.0)
            elif meta.get("relation"):
                scores.append(float(any(_related(a, b, meta["relation"], self.cfg.margin)
                                        for a in found[0] for b in found[1])))
            else:
                scores.append(math.nan)
        return {"score": torch.tensor(scores, dtype=torch.float32)}


class CleanBackgroundReward(_ShapesReward):
    """score = max(0, 1 − stray / max_stray), stray = pixels neither background nor within 1 px of an object
    (faint colour speckle, specks, off-palette colours): guards against speckle reward hacking."""

    Config = CleanConfig
    name = "shapes_clean"

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        detect, _ = _world()
        stray = detect.stray_pixels(batch.pixels.detach().float(), self.cfg.tau, self.cfg.min_area).float().cpu()
        return {"score": (1 - stray / self.cfg.max_stray).clamp(min=0.0), "stray_pixels": stray}
