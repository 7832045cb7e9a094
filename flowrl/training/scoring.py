"""The reward stage: this process's decoded samples → R (N, K) gathered over processes, plus per-reward metrics.

NaN in R means "does not apply to this sample"; ±inf is a reward failure on that sample. Both are counted per
reward (``reward/<name>/nonfinite``) and left to the advantage stage, which treats them as not applicable.
The rollout images' hacking statistics (``flowrl.eval.detectors``: dark/bright fraction, edge density, colour
entropy; palette distance and stray pixels when a reward declares ``shapes_world``) are logged as
``detect/<stat>`` batch means of this process, so a drifting policy shows in the training curves before the
evaluation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.types import RewardInput


@dataclass
class Scores:
    R: Tensor                          # (N, K) over all processes, float32
    names: list[str]                   # the K reward names, in column order
    metrics: dict


def reward_input(pixels, prompts, group_ids, meta) -> RewardInput:
    """What the reward set scores: the pixels as float32 in [0, 1] with their prompts, groups, metadata and the
    prompts' source images (image-conditioned prompts; None otherwise)."""
    from flowrl.data.images import source_images

    return RewardInput(pixels.float().clamp(0, 1), prompts, group_ids, meta, source_images(meta))


def score_samples(rewards, dist, samples) -> Scores:
    """Score ``samples.pixels`` with the reward set; gather the (n, K) scores into (N, K)."""
    batch = reward_input(samples.pixels, samples.prompts, samples.group_ids, samples.meta)
    return summarize(rewards(batch), batch, rewards.shapes_world, dist)


def summarize(out, batch: RewardInput, shapes_world: bool, dist) -> Scores:
    """The reward set's output ``out`` (``RewardScores`` of this process's ``batch``) → gathered R and metrics."""
    R = dist.gather(out.scores.float())
    metrics = {}
    for k, name in enumerate(out.names):
        col = R[:, k]
        ok = col[torch.isfinite(col)]
        metrics[f"reward/{name}/mean"] = ok.mean() if ok.numel() else float("nan")
        metrics[f"reward/{name}/std"] = ok.std(unbiased=False) if ok.numel() > 1 else 0.0
        metrics[f"reward/{name}/nonfinite"] = int((~torch.isfinite(col)).sum())
    total = dist.gather(out.total.float())
    ok = total[torch.isfinite(total)]
    metrics["reward/total/mean"] = ok.mean().item() if ok.numel() else float("nan")
    metrics.update(image_detectors(batch, shapes_world))
    return Scores(R, list(out.names), metrics)


def image_detectors(batch: RewardInput, shapes_world: bool) -> dict:
    """``detect/<stat>`` means of the batch's images (videos: none); the palette statistics too when a reward
    declares its images shapes-world scenes (``shapes_world``, rewards/base.py)."""
    from flowrl.eval.detectors import image_statistics

    if batch.is_video:
        return {}
    return {f"detect/{k}": v.mean() for k, v in image_statistics(batch.pixels, shapes_world).items()}
