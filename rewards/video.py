"""Video rewards: any image reward averaged over frames, and CLIP temporal consistency.

    video_frame_mean:      r(v) = mean_f r_img(v_f)   over frames f = 0, s, 2s, …  (NaN frames skipped)
    temporal_consistency:  r(v) = 1/(F'−1) Σ_f cos(E(v_f), E(v_{f+1}))   E = CLIP image embedding
                           (the "subject/background consistency" style of VBench, with open_clip CLIP)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rewards.base import RewardInput, nanmean
from rewards.clip_openclip import OpenClipReward
from rewards.preprocess import quantize_uint8


@dataclass
class FrameMeanConfig:
    reward: str = "aesthetic"                          # any image reward: name or module:attr
    kwargs: dict = field(default_factory=dict)         # its options
    frame_stride: int = 1                              # score every s-th frame
    batch_size: int | None = None                      # frames per call of the image reward


class VideoFrameMean:
    """Mean over (strided) frames of an image reward; sub-scores averaged the same way."""

    Config = FrameMeanConfig
    name = "video_frame_mean"
    accepts = ("video",)

    def __init__(self, cfg: FrameMeanConfig | None = None):
        self.cfg = cfg or FrameMeanConfig()
        if self.cfg.frame_stride < 1:
            raise ValueError(f"frame_stride must be ≥ 1, got {self.cfg.frame_stride}")
        self.inner = None

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        from rewards.build import instantiate, resolve

        name = f"video_frame_mean[{self.cfg.reward}]"
        self.inner = instantiate(resolve(self.cfg.reward), self.cfg.kwargs, name)
        if callable(getattr(self.inner, "setup", None)):
            self.inner.setup(device, dtype)
        if "image" not in tuple(getattr(self.inner, "accepts", ("image",))):
            raise ValueError(f"{name}: the wrapped reward must accept images")

    def _score_frames(self, frames: RewardInput) -> dict[str, Tensor]:
        """The inner reward on (B·F) frames in chunks, as {"score", ...}; raw call, so gradients survive."""
        n, size = len(frames), self.cfg.batch_size or len(frames)
        parts = []
        for i in range(0, n, size):
            out = self.inner(frames.select(range(i, min(i + size, n))))
            parts.append(dict(out) if isinstance(out, dict) else {"score": torch.as_tensor(out)})
        return {k: torch.cat([p[k].float().reshape(-1) for p in parts]) for k in parts[0]}

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        video = batch.pixels[:, :: self.cfg.frame_stride]
        b, f = video.shape[:2]
        frames = RewardInput(
            pixels=video.reshape(b * f, *video.shape[2:]),
            prompts=[p for p in batch.prompts for _ in range(f)],
            group_ids=batch.group_ids.repeat_interleave(f),
            meta=[m for m in batch.meta for _ in range(f)],
        )
        out = self._score_frames(frames)
        return {k: nanmean(v.reshape(b, f), dim=1) for k, v in out.items()}


@dataclass
class TemporalConfig:
    model_name: str = "ViT-L-14"
    pretrained: str | None = "openai"
    checkpoint: str | None = None
    checkpoint_key: str | None = None
    model_config: str | None = None
    frame_stride: int = 1
    quantize_uint8: bool = True


def consecutive_cosine(emb: Tensor) -> Tensor:
    """(B, F, D) unit embeddings → (B,) mean cosine of consecutive frames; NaN when F < 2."""
    if emb.shape[1] < 2:
        return torch.full(emb.shape[:1], float("nan"))
    return (emb[:, 1:] * emb[:, :-1]).sum(-1).mean(1)


class TemporalConsistency(OpenClipReward):
    """Mean cosine similarity of consecutive frames' CLIP image embeddings (1 = static video)."""

    Config = TemporalConfig
    name = "temporal_consistency"
    accepts = ("video",)

    def __call__(self, batch: RewardInput) -> Tensor:
        from rewards.clip_openclip import clip_pixels, encode_images

        video = batch.pixels[:, :: self.cfg.frame_stride].to(self.device)
        b, f = video.shape[:2]
        x = video.reshape(b * f, *video.shape[2:])
        x = quantize_uint8(x) if self.cfg.quantize_uint8 else x
        emb = encode_images(self.model, clip_pixels(self.model, x, self.dtype)).view(b, f, -1)
        return consecutive_cosine(emb).cpu()
