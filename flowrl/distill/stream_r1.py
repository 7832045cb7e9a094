"""Stream-R1: reward-weighted DMD at rollout level (Inter-Reliability) and element level (Intra-Perplexity).

Stream-R1 (``wangbei1/Stream-R1: model/stream_r1.py``, arXiv 2605.03849):

    L = exp(β·r_final) · mean( W_intra ⊙ ½(x − sg(x − g))² )     ⇒  ∂L/∂x = exp(β r_final)·W_intra ⊙ g / N
    r̄ = mean_d r_d over quality axes d (visual, motion, text; each r_d = (raw_d − μ_d)/σ_d)
    r_final = r̄ − λ·std_d(Δ_d),  Δ_d = mean(recent half) − mean(early half) of axis d over a window (len 50)
    S = Σ_m softmax(−r/τ)_m · ‖∂r_m/∂pixels‖₂   (resized to the latent grid)
    w_t = clamp((1−a_t) + a_t·minmax(mean_hw S), τ_min)/mean;  w_s = clamp((1−a_s) + a_s·minmax(S_f), σ_min)/mean
    W_intra = w_t ⊙ w_s / mean

Deviations (named in docs/distill.md): rewards come from flowrl's registry (no VideoAlign), scored per sample
rather than on batch element 0 only; the rollout weight is detached by default (``detach_weight``), as the
reference could not confirm whether Stream-R1 back-propagates it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class Config:
    """Stream-R1 defaults (``configs/exp_stream_r1.yaml``); axes name flowrl rewards by registry name."""

    # Stream-R1's three VideoAlign axes (VQ, MQ, TA), each mapped to a flowrl reward by registry name
    axes: dict[str, str] = field(default_factory=lambda: {"visual_quality": "video_frame_mean",
                                                          "motion_quality": "temporal_consistency",
                                                          "text_alignment": "video_frame_mean"})
    axis_kwargs: dict[str, dict[str, Any]] = field(default_factory=lambda: {    # per-axis reward kwargs
        "visual_quality": {"reward": "aesthetic"}, "text_alignment": {"reward": "clipscore"}})
    axis_mean: dict[str, float] = field(default_factory=dict)    # μ_d (default 0)
    axis_std: dict[str, float] = field(default_factory=dict)     # σ_d (default 1)
    beta: float = 2.0
    detach_weight: bool = True
    balance_lambda: float = 0.5
    balance_window: int = 50
    saliency: bool = True
    saliency_tau: float = 1.0
    temporal_strength: float = 1.0    # a_t
    spatial_strength: float = 1.0     # a_s
    temporal_floor: float = 0.2       # τ_min
    spatial_floor: float = 0.15       # σ_min


def rollout_weight(reward: Tensor, beta: float) -> Tensor:
    """W_inter = exp(β·r)."""
    return torch.exp(beta * reward)


class AxisBalance:
    """Sliding-window balance across quality axes: r_final = r̄ − λ·std_d(Δ_d) once the window is full."""

    def __init__(self, num_axes: int, window: int = 50, lam: float = 0.5):
        self.window, self.lam = window, lam
        self.history: list[list[float]] = [[] for _ in range(num_axes)]

    def __call__(self, rewards: Tensor) -> Tensor:
        """rewards (B, K) normalised per axis → r_final (B,); records the batch means."""
        for d in range(rewards.shape[1]):
            self.history[d] = (self.history[d] + [float(rewards[:, d].mean())])[-self.window:]
        mean = rewards.mean(dim=1)
        if len(self.history[0]) < self.window or rewards.shape[1] < 2:
            return mean
        half = self.window // 2
        deltas = torch.tensor([sum(h[half:]) / (len(h) - half) - sum(h[:half]) / half for h in self.history])
        return mean - self.lam * deltas.std()

    def state_dict(self) -> dict:
        return {"history": [list(h) for h in self.history]}

    def load_state_dict(self, state: dict) -> None:
        self.history = [list(map(float, h)) for h in state["history"]]


def fuse_saliency(pixel_grads: Tensor, rewards: Tensor, tau: float, latent_fhw: tuple[int, int, int]) -> Tensor:
    """S (B, F, H, W) on the latent grid from per-axis pixel gradients (K, B, F', 3, H', W').

    S_m = ‖∂r_m/∂pixels‖₂ over channels, trilinearly resized to (F, H, W); fused with ω = softmax(−r/τ) (B, K).
    """
    s = pixel_grads.float().norm(dim=3)                                     # (K, B, F', H', W')
    k, b = s.shape[:2]
    s = F.interpolate(s.reshape(k * b, 1, *s.shape[2:]), size=latent_fhw, mode="trilinear", align_corners=False)
    s = s.reshape(k, b, *latent_fhw)
    w = torch.softmax(-rewards.float() / tau, dim=1).T                     # (K, B)
    return (w[:, :, None, None, None] * s).sum(0)


def _minmax(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    lo, hi = x.amin(dim=dims, keepdim=True), x.amax(dim=dims, keepdim=True)
    return (x - lo) / (hi - lo).clamp_min(1e-12)


def intra_weights(saliency: Tensor, a_t: float = 1.0, a_s: float = 1.0, tau_min: float = 0.2,
                  sigma_min: float = 0.15) -> Tensor:
    """W_intra (B, 1, F, H, W) from saliency (B, F, H, W): temporal × spatial factors, floored, mean 1."""
    temporal = _minmax(saliency.mean(dim=(2, 3)), (1,))                    # (B, F)
    w_t = ((1 - a_t) + a_t * temporal).clamp(min=tau_min)
    w_t = w_t / w_t.mean(dim=1, keepdim=True)
    w_s = ((1 - a_s) + a_s * _minmax(saliency, (2, 3))).clamp(min=sigma_min)
    w_s = w_s / w_s.mean(dim=(2, 3), keepdim=True)
    w = w_t[:, :, None, None] * w_s
    return (w / w.mean(dim=(1, 2, 3), keepdim=True)).unsqueeze(1)


def score_axes(reward_fns: list, pixels: Tensor, prompts: list[str], want_grad: bool
               ) -> tuple[Tensor, Tensor | None]:
    """Raw rewards (B, K) and, when ``want_grad``, their pixel gradients (K, B, F', 3, H', W').

    Each reward is a flowrl reward callable ``fn(RewardInput) -> Tensor[B] | {"score": ...}``; a reward that
    is not differentiable yields a zero gradient (uniform saliency for that axis)."""
    from flowrl.types import RewardInput

    scores, grads = [], []
    for fn in reward_fns:
        px = pixels.detach().clone().requires_grad_(want_grad)
        with torch.set_grad_enabled(want_grad):
            out = fn(RewardInput(px, list(prompts), torch.arange(len(prompts))))
            r = out["score"] if isinstance(out, dict) else out
            r = r.to(pixels.device).float()
        if want_grad:
            g = torch.autograd.grad(r.sum(), px, allow_unused=True)[0] if r.requires_grad else None
            grads.append(torch.zeros_like(px) if g is None else g)
        scores.append(r.detach())
    return torch.stack(scores, dim=1), (torch.stack(grads) if want_grad else None)


def normalise_axes(raw: Tensor, cfg: Config) -> Tensor:
    """r_d = (raw_d − μ_d)/σ_d per axis (μ = 0, σ = 1 unless configured)."""
    names = list(cfg.axes)
    mu = torch.tensor([cfg.axis_mean.get(n, 0.0) for n in names], device=raw.device)
    sd = torch.tensor([cfg.axis_std.get(n, 1.0) for n in names], device=raw.device)
    return (raw - mu) / sd
