"""The one shared vocabulary of flowrl.  Imports only torch.

Convention (stated once, used everywhere): rectified flow,

    x_σ = (1 − σ)·x0 + σ·ε,   σ ∈ [0, 1],  σ = 1 is pure noise, σ = 0 is data,
    the policy predicts the velocity v ≈ ε − x0,

so an Euler step from σ to σ' is ``x' = x + (σ' − σ)·v`` and the predictions are
``x̂0 = x − σ·v`` and ``x̂1 = x + (1 − σ)·v`` (diffusers' FlowMatchEulerDiscreteScheduler).

Shapes: B batch, image latents (B, C, H, W), video latents (B, C, F, H, W), K stored steps.
Pixels are float in [0, 1]: images (B, 3, H, W), videos (B, F, 3, H, W).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

VelocityFn = Callable[[Tensor, Tensor], Tensor]
"""``v = velocity_fn(x, sigma)``: x (B, ...) latents, sigma (B,) float, returns v shaped like x."""


def _index_tensors(d: dict[str, Tensor], idx) -> dict[str, Tensor]:
    return {k: v[idx] for k, v in d.items()}


@dataclass
class Cond:
    """Prompt conditioning produced by ``Policy.encode``.

    embeds: model-specific tensors, batch-first (e.g. SD3: ``prompt_embeds`` (B, L, D),
        ``pooled_prompt_embeds`` (B, P)).
    uncond: the same keys for the negative / unconditional prompt (B, ...), or None when the
        policy was encoded without CFG.
    prompts: the B prompt strings.
    """

    embeds: dict[str, Tensor]
    uncond: dict[str, Tensor] | None
    prompts: list[str]

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, idx: Sequence[int] | Tensor) -> Cond:
        """Rows ``idx`` of every tensor (and prompt)."""
        idx_t = torch.as_tensor(idx, dtype=torch.long)
        ids = idx_t.tolist()
        return Cond(
            _index_tensors(self.embeds, idx_t),
            None if self.uncond is None else _index_tensors(self.uncond, idx_t),
            [self.prompts[i] for i in ids],
        )

    def repeat_interleave(self, n: int) -> Cond:
        """Each row repeated ``n`` times in place (a group of n samples per prompt)."""
        idx = torch.arange(len(self)).repeat_interleave(n)
        return self.select(idx)

    def to(self, device: torch.device | str) -> Cond:
        def mv(d):
            return None if d is None else {k: v.to(device) for k, v in d.items()}

        return Cond(mv(self.embeds), mv(self.uncond), list(self.prompts))


@dataclass
class StepOut:
    """One sampler transition x (at σ) → x_next (at σ_next).

    x_next: (B, ...) latents at σ_next.
    mean:   (B, ...) transition mean μ(x, v, σ, σ_next).
    std:    (B,) transition std (0 for a deterministic step); float32.
    """

    x_next: Tensor
    mean: Tensor
    std: Tensor


@dataclass
class Trajectory:
    """The stored (stochastic, trainable) steps of a rollout; ODE steps are not stored.

    x:        (B, K, ...) latents before each stored step.
    x_next:   (B, K, ...) latents after each stored step.
    mean:     (B, K, ...) transition means at rollout time.
    std:      (B, K) transition stds.
    log_prob: (B, K) rollout-time log π_old (reduction of the sampler's choice, see samplers).
    sigma:    (B, K) σ of each stored step;  sigma_next: (B, K) σ_next.
    step_idx: (K,) index of each stored step in the schedule.
    noise:    (B, K, ...) the ε drawn at each stored step (replay), or None.
    rollout_log_prob: (B, K) log π_rollout of a lossy rollout accelerator (``log_prob`` then holds the exact
              "old" policy's recomputed log-prob), or None for an exact rollout.
    is_weight: (B, K) the rollout-correction weight W of each stored step (flowrl/objectives/rollout_correction.py),
              or None (no correction: weight 1).
    """

    x: Tensor
    x_next: Tensor
    mean: Tensor
    std: Tensor
    log_prob: Tensor
    sigma: Tensor
    sigma_next: Tensor
    step_idx: Tensor
    noise: Tensor | None = None
    rollout_log_prob: Tensor | None = None
    is_weight: Tensor | None = None

    def select(self, idx: Tensor) -> Trajectory:
        """Rows ``idx`` (sample axis) of every per-sample tensor."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v if (v is None or f.name == "step_idx") else v[idx]
        return Trajectory(**out)


@dataclass
class RolloutResult:
    """What a rollout engine returns: final latents and the stored trajectory.

    latents: (B, ...) final latents at σ = 0 (or the last σ of the schedule).
    sigmas:  (S+1,) the schedule used.
    traj:    stored steps, or None when nothing was stored (ODE / forward-process objectives).
    x0_pred: (B, ...) x̂0 predicted at the last step (DanceGRPO decodes this), or None.
    nfe:     number of velocity evaluations per sample (a CFG forward counts once).
    path:    (B, S+1, ...) every boundary state x_{σ_0} … x_{σ_S} of a deterministic rollout stored on request
             (an all-ODE plan with ``store``: TDM-R1's per-step states), else None.
    """

    latents: Tensor
    sigmas: Tensor
    traj: Trajectory | None = None
    x0_pred: Tensor | None = None
    nfe: int = 0
    path: Tensor | None = None

    def select(self, idx: Tensor) -> RolloutResult:
        """Rows ``idx`` (sample axis) of the latents, trajectory and x̂0; the schedule and NFE are shared."""
        return RolloutResult(self.latents[idx], self.sigmas, None if self.traj is None else self.traj.select(idx),
                             None if self.x0_pred is None else self.x0_pred[idx], self.nfe,
                             None if self.path is None else self.path[idx])


@dataclass(frozen=True)
class RewardInput:
    """The batch a reward sees.

    pixels:    (B, 3, H, W) images or (B, F, 3, H, W) videos, float32 in [0, 1], on the reward's device.
    prompts:   B prompt strings.
    group_ids: (B,) int64; equal ids came from the same prompt (for groupwise rewards).
    meta:      B dicts of per-sample dataset metadata (e.g. {"ocr_text": ...}, shapes-world specs).
    images:    the prompts' source / reference images, for rewards that compare (editing): None when no prompt
               has one, else B entries, each None or a list of float32 (3, H, W) tensors in [0, 1] (CPU).
    """

    pixels: Tensor
    prompts: list[str]
    group_ids: Tensor
    meta: list[dict] = field(default_factory=list)
    images: list[list[Tensor] | None] | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def is_video(self) -> bool:
        return self.pixels.dim() == 5

    def select(self, idx: Sequence[int]) -> RewardInput:
        idx = list(idx)
        return replace(
            self,
            pixels=self.pixels[idx],
            prompts=[self.prompts[i] for i in idx],
            group_ids=self.group_ids[idx],
            meta=[self.meta[i] for i in idx] if self.meta else [],
            images=None if self.images is None else [self.images[i] for i in idx],
        )


@dataclass
class LossOut:
    """An objective's result: a scalar loss and detached metrics with stable names
    (``ratio``, ``clipfrac``, ``kl``, ``policy_loss``...)."""

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)


def check_images(images: Sequence | None, batch: int, family: str, accepts: bool) -> list | None:
    """``images`` as a list of B entries (None or a list of (3, H, W) float tensors in [0, 1]), or None when no
    row carries one; one-line ValueError for a bad entry, or for images given to a family without
    ``accepts_images``."""
    if images is None:
        return None
    rows = list(images)
    if len(rows) != batch:
        raise ValueError(f"images: {len(rows)} entries for {batch} prompts; give one entry (None or a list) per prompt")
    if all(r is None or len(r) == 0 for r in rows):
        return None
    if not accepts:
        raise ValueError(f"the {family!r} policy does not accept images, but a prompt carries reference images; "
                         "use an image-conditioned family (e.g. qwen_image_edit) or a prompt file without images")
    for i, row in enumerate(rows):
        for img in row or []:
            if not isinstance(img, Tensor) or img.dim() != 3 or img.shape[0] != 3 or not img.is_floating_point():
                raise ValueError(f"images[{i}]: each reference image must be a float tensor (3, H, W) in [0, 1], got "
                                 f"{type(img).__name__} {tuple(getattr(img, 'shape', ()))}")
    return [None if not r else list(r) for r in rows]


def attach_first_frames(cond, firsts: list, device) -> "Cond":
    """``cond`` with ``embeds["image"]`` (B, C, H, W): row b's first frame, zeros where ``firsts[b]`` is None, and
    ``embeds["has_image"]`` (B,) 1/0; unchanged when no row has one. The frames must share one shape (callers
    check it, with their family's wording)."""
    shapes = {tuple(f.shape) for f in firsts if f is not None}
    if not shapes:
        return cond
    blank = torch.zeros(next(iter(shapes)))
    cond.embeds["image"] = torch.stack([blank if f is None else f.float().cpu() for f in firsts]).to(device)
    cond.embeds["has_image"] = torch.tensor([float(f is not None) for f in firsts], device=device)
    return cond
