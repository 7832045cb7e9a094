"""Reward sets of the shapes world that pull against each other, for benchmarking multi-reward balancers
(docs/rewards.md "Conflicting reward sets").

Specialist sparsity (MARBLE's mechanism, arXiv 2605.06507: a reward that does not apply to a sample is NaN):

    shapes_count_only     = shapes_count     on counting prompts,             NaN elsewhere
    shapes_position_only  = shapes_position  on position / relation prompts,  NaN elsewhere
    shapes_color_only     = shapes_color     on colour / binding prompts,     NaN elsewhere

Pixel budgets that conflict with the verifier, on ink = pixels P(p) with ‖P(p) − background‖₂ ≥ τ
(``detect.palette_distances`` channel 0, τ = 0.25 as in detection):

    shapes_ink_budget     = 1 − min(1, |ink| / max_ink)                        (vs counting: n objects need ink)
    shapes_centering      = clamp(1 − ‖c_ink − c_img‖₂ / (S/2), 0, 1)          (vs position: "on the left")

with c_ink the mean (x, y) of the ink pixels, c_img = ((W − 1)/2, (H − 1)/2) and S/2 = min(H, W)/2 = 16 px.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.types import RewardInput
from rewards.shapes import SKILLS, ColorReward, CountReward, PositionReward, _ShapesReward, _world, metas_of


def nan_off_skills(out: dict[str, Tensor], batch: RewardInput, skills: tuple[str, ...]) -> dict[str, Tensor]:
    """Every output NaN on samples whose prompt skill is not in ``skills`` (the skill comes from ``batch.meta``
    or the parsed prompt, as for every shapes reward)."""
    applies = torch.tensor([m["skill"] in skills for m in metas_of(batch)])
    return {k: torch.where(applies, v, torch.full_like(v, math.nan)) for k, v in out.items()}


class _OnlyOnSkills:
    """Mixin: the wrapped shapes reward, NaN off the prompt skills ``skills``."""

    skills: tuple[str, ...] = ()

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        return nan_off_skills(super().__call__(batch), batch, self.skills)


class CountOnlyReward(_OnlyOnSkills, CountReward):
    """score = 1 − mean_j min(1, |n̂_j − n_j| / n_j) on counting prompts (``shapes_count``), NaN elsewhere."""

    name = "shapes_count_only"
    skills = ("counting",)


class PositionOnlyReward(_OnlyOnSkills, PositionReward):
    """score = ``shapes_position`` on position and relation prompts (fraction of the named objects in the named
    half; 1 if some pair stands in the named relation), NaN elsewhere.  On grammar prompts it equals
    ``shapes_position``, which is NaN exactly where no position or relation is named; this variant states the
    applicability by skill, like the other two specialists."""

    name = "shapes_position_only"
    skills = ("position", "relation")


class ColorOnlyReward(_OnlyOnSkills, ColorReward):
    """score = colour recall · precision (``shapes_color``) on colour and binding prompts, NaN elsewhere
    (sub-scores color_recall / color_precision likewise)."""

    name = "shapes_color_only"
    skills = ("color", "binding")


def ink_mask(pixels: Tensor, tau: float) -> Tensor:
    """(B, H, W) bool: pixels at RGB distance ≥ ``tau`` from the background colour."""
    detect, _ = _world()
    return detect.palette_distances(pixels.detach().float())[:, 0] >= tau


@dataclass
class PixelConfig:
    tau: float = 0.25                        # RGB distance from the background at which a pixel counts as ink
    skills: tuple[str, ...] | None = None    # score only prompts of these skills (NaN elsewhere); None = all

    def __post_init__(self):
        if self.tau <= 0:
            raise ValueError(f"{type(self).__name__}.tau must be > 0, got {self.tau}")
        if self.skills is not None:
            self.skills = tuple(self.skills)
            if unknown := set(self.skills) - set(SKILLS):
                raise ValueError(f"{type(self).__name__}.skills: unknown {sorted(unknown)}; expected some of {SKILLS}")


@dataclass
class InkConfig(PixelConfig):
    max_ink: int = 196                       # MAX_OBJECTS · 7² px: the most ink a correct scene of the grammar needs

    def __post_init__(self):
        super().__post_init__()
        if self.max_ink <= 0:
            raise ValueError(f"InkConfig.max_ink must be > 0, got {self.max_ink}")


class InkBudgetReward(_ShapesReward):
    """score = 1 − min(1, |ink| / max_ink), |ink| the pixels at distance ≥ τ from the background and max_ink =
    196 = 4 objects × 7×7 px (the largest scene the grammar asks for; docs/rewards.md set 2).  A blank image
    scores 1; four 7-px squares score 0.  Sub-score ``ink_pixels``.  ``skills: [counting]`` restricts it to
    counting prompts (NaN elsewhere), for set 2 over the balanced prompt mix."""

    Config = InkConfig
    name = "shapes_ink_budget"

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        ink = ink_mask(batch.pixels, self.cfg.tau).flatten(1).sum(1).float().cpu()
        out = {"score": 1 - (ink / self.cfg.max_ink).clamp(max=1.0), "ink_pixels": ink}
        return out if self.cfg.skills is None else nan_off_skills(out, batch, self.cfg.skills)


@dataclass
class CenteringConfig(PixelConfig):
    blank: float = 0.0                       # score of an image without ink (no centroid); math.nan = n/a


class CenteringReward(_ShapesReward):
    """score = clamp(1 − ‖c_ink − c_img‖₂ / (S/2), 0, 1), c_ink the mean (x, y) of the ink pixels, c_img =
    ((W − 1)/2, (H − 1)/2), S/2 = min(H, W)/2 (16 px in the 32-px world; docs/rewards.md set 3).  A blank image
    scores ``blank`` (default 0: no object, so nothing is centred and an empty image is never a way out of the
    term; set NaN to mark it "not applicable").  Sub-score ``offset_px`` = ‖c_ink − c_img‖₂ (NaN if blank).
    ``skills`` restricts it to some prompt skills, as for the ink budget."""

    Config = CenteringConfig
    name = "shapes_centering"

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        ink = ink_mask(batch.pixels, self.cfg.tau).float().cpu()
        _, h, w = ink.shape
        area = ink.flatten(1).sum(1)
        cy = (ink.sum(2) * torch.arange(h)).sum(1) / area
        cx = (ink.sum(1) * torch.arange(w)).sum(1) / area
        offset = torch.hypot(cx - (w - 1) / 2, cy - (h - 1) / 2)  # NaN where area = 0
        score = (1 - offset / (min(h, w) / 2)).clamp(0.0, 1.0)
        out = {"score": torch.where(area > 0, score, torch.full_like(score, self.cfg.blank)), "offset_px": offset}
        return out if self.cfg.skills is None else nan_off_skills(out, batch, self.cfg.skills)
