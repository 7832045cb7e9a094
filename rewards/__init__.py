"""Reward plugins: the registry, the contract, and the composite ``RewardSet``.

Importing this package is cheap: each reward module loads its model library (transformers, open_clip, an
OCR engine) only inside ``setup``.  A reward is found by registry name, by a ``flowrl.rewards`` package entry
point, or by a ``module:attr`` / ``path/to/file.py:attr`` string (see docs/rewards.md).
"""
from flowrl.registry import Registry
from rewards.base import RewardError, RewardInput, make_input
from rewards.build import build_reward
from rewards.compose import RewardScores, RewardSet, RewardSpec

REWARDS = Registry(
    "reward",
    {
        "jpeg_compressibility": "rewards.jpeg:JpegCompressibility",
        "jpeg_incompressibility": "rewards.jpeg:JpegIncompressibility",
        "source_fidelity": "rewards.source:SourceFidelity",
        "pickscore": "rewards.pickscore:PickScore",
        "aesthetic": "rewards.aesthetic:Aesthetic",
        "hpsv2": "rewards.hpsv2:HPSv2",
        "clipscore": "rewards.clipscore:CLIPScore",
        "ocr": "rewards.ocr:OCR",
        "video_frame_mean": "rewards.video:VideoFrameMean",
        "temporal_consistency": "rewards.video:TemporalConsistency",
        "remote": "rewards.remote:RemoteReward",
        "delayed": "rewards.latency:DelayedReward",
        "shapes": "rewards.shapes:ShapesVerifier",
        "shapes_count": "rewards.shapes:CountReward",
        "shapes_color": "rewards.shapes:ColorReward",
        "shapes_position": "rewards.shapes:PositionReward",
        "shapes_clean": "rewards.shapes:CleanBackgroundReward",
        "shapes_count_only": "rewards.shapes_sets:CountOnlyReward",
        "shapes_position_only": "rewards.shapes_sets:PositionOnlyReward",
        "shapes_color_only": "rewards.shapes_sets:ColorOnlyReward",
        "shapes_ink_budget": "rewards.shapes_sets:InkBudgetReward",
        "shapes_centering": "rewards.shapes_sets:CenteringReward",
        "video_shapes": "rewards.video_shapes:VideoShapesVerifier",
        "video_shapes_consistency": "rewards.video_shapes:VideoShapesConsistency",
    },
    entry_point_group="flowrl.rewards",
)


def register(name: str):
    """Decorator: ``@register("brightness")`` on a reward class or function makes it usable by name."""
    return REWARDS.register(name)


__all__ = [
    "REWARDS",
    "RewardError",
    "RewardInput",
    "RewardScores",
    "RewardSet",
    "RewardSpec",
    "build_reward",
    "make_input",
    "register",
]
