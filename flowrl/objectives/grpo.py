"""Flow-GRPO / DanceGRPO — PPO-clip on the stored SDE transitions (Liu et al., arXiv 2505.05470,
FG@9745241 scripts/train_sd3.py L870–905; Xue et al. DanceGRPO train_grpo_flux.py ``train_one_step``).

For each trained stored step j of sample i (x_j → x_{j+1} stored, σ_j → σ_{j+1}):
    v_θ   = policy.velocity(x_j, σ_j, c, w)  under the "train" adapter (w = the rollout's CFG, or 1 for no-CFG)
    μ_θ, s = kernel.step(x_j, v_θ, σ_j, σ_{j+1}, x_next=x_{j+1})   — the SAME kernel and Config as the rollout
    log π_θ = kernel.log_prob(x_{j+1}, μ_θ, s)                     — the rollout's reduction (mean over elements)
    r     = exp(log π_θ − log π_old),   A = clamp(A, −5, 5)
    L_clip = mean_i max(−A·r, −A·clip(r, 1−ε, 1+ε))                 (ε = clip_range = 1e-4)
    KL_j  = mean_i mean_elems(μ_θ − μ_ref)² / (2 g²)                (μ_ref: same step, adapters disabled)
    loss  = mean_j (L_clip + β·KL_j)
KL forms: ``flow_grpo`` divides by 2g² with g the diffusion coefficient WITHOUT √|dt| (g² = s²/|dt|) — Flow-GRPO's
code, i.e. |dt|/D times the true KL; ``gaussian`` divides by 2s² (the per-element Gaussian KL); ``unscaled``
drops the division (FlowCPS). β = 0.04 (Flow-GRPO SD3 GenEval/OCR; PickScore 0.01, FLUX and no-CFG configs 0;
DanceGRPO has no KL). ``batch.steps`` chooses per-step (one index per call, Flow-GRPO's loop) or window
training (several indices averaged in one call: MixGRPO). The kernel, its Config and the log-prob reduction
are the rollout's (``batch.kernel``, ``batch.kernel_cfg``, ``batch.reduce``; owned by ``sampler:``), never set
here, so rollout and training log-probs always come from one function. Behind a lossy rollout accelerator
with ``sampler.correction`` the stored log π_old is the exact "old" policy's, recomputed, and each step's
per-sample loss is multiplied by the detached rollout-correction weight W_ij (TIS / RS, verl decoupled mode,
``flowrl/objectives/rollout_correction.py``). GRPO trains on the stored trajectory
(``TRAINS_ON``) and samples with the current weights (``old_update = on_policy``: old ← train every update).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from flowrl.objectives.batch import TrainBatch, masked_mean, mean_elems
from flowrl.objectives.old_policy import OldUpdate, check_positive
from flowrl.objectives.sources import TRAJECTORY_ROWS
from flowrl.registry import import_string
from flowrl.types import LossOut

TRAINS_ON = TRAJECTORY_ROWS
RATIO_BASED = True          # the ratio is taken against the rollout's stored log-probs (π_old)
ROLLOUT_CORRECTION = True   # applies the stored rollout-correction weights (traj.is_weight) of a lossy rollout
KL_FORMS = ("flow_grpo", "gaussian", "unscaled")


@dataclass
class Config:
    clip_range: float = 1e-4
    adv_clip_max: float = 5.0         # |A| ≤ 5 (adv_clip_max of every GRPO anchor)
    beta_kl: float = 0.04
    kl_form: Literal["flow_grpo", "gaussian", "unscaled"] = "flow_grpo"
    train_guidance: float | None = None   # None → the rollout's guidance (batch.guidance); 1.0 → no-CFG training
    old_update: OldUpdate = "on_policy"   # the sampling adapter follows the trained one after every iteration
    objective: ClassVar[str] = "grpo"     # the name in error messages (a subclass's objective names itself)

    def __post_init__(self):
        check_positive(self.objective, clip_range=self.clip_range, adv_clip_max=self.adv_clip_max)
        if self.kl_form not in KL_FORMS:
            raise ValueError(f"{self.objective} kl_form must be one of {KL_FORMS}, got {self.kl_form!r}")
        if self.beta_kl < 0:
            raise ValueError(f"{self.objective} beta_kl must be >= 0, got {self.beta_kl}")


def resolve_kernel(kernel: Any) -> Any:
    """The kernel bundle (``.step``, ``.log_prob``, ``.Config``): a Kernel, a ``samplers.KERNELS`` name or a
    ``module:attr`` string."""
    if isinstance(kernel, str):
        name = kernel
        if ":" in name:
            kernel = import_string(name)
        else:
            import samplers

            kernel = samplers.KERNELS.get(name)
    for attr in ("step", "log_prob", "Config"):
        if not hasattr(kernel, attr):
            raise TypeError(f"kernel {kernel!r} has no {attr!r}; a kernel bundle provides step, log_prob and Config")
    return kernel


def clipped_surrogate(adv: Tensor, ratio: Tensor, clip_range: float) -> Tensor:
    """Per-sample PPO-clip loss max(−A·r, −A·clip(r, 1−ε, 1+ε))."""
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_range, 1 + clip_range))


def mean_kl(mean: Tensor, mean_ref: Tensor, std: Tensor, dt: Tensor, form: str) -> Tensor:
    """Per-sample KL surrogate mean_elems(μ − μ_ref)² / (2·scale²) (module docstring). (B,)"""
    sq = mean_elems((mean - mean_ref) ** 2)
    if form == "unscaled":
        return sq
    var = std.float() ** 2
    if form == "flow_grpo":
        var = var / dt.abs()
    return sq / (2 * var)


@dataclass(frozen=True)
class StoredSteps:
    """How a TrainBatch's stored steps are re-scored: the rollout's kernel bundle and Config, the stored-step
    indices trained in this call and the CFG scale of the training forwards."""

    kernel: Any
    kernel_cfg: Any
    steps: list[int]
    guidance: float | None


def stored_steps(batch: TrainBatch, objective: str, train_guidance: float | None) -> StoredSteps:
    """Check ``batch`` holds a trajectory and a kernel and resolve what re-scoring its steps needs."""
    batch.require("traj", objective=objective)
    if batch.kernel is None:
        raise ValueError(f"{objective}: TrainBatch.kernel is None; pass the rollout's step kernel (and kernel_cfg)")
    kernel = resolve_kernel(batch.kernel)
    kcfg = batch.kernel_cfg if batch.kernel_cfg is not None else kernel.Config()
    n_stored = batch.traj.x.shape[1]
    steps = list(range(n_stored)) if batch.steps is None else [int(j) for j in batch.steps]
    if not steps or max(steps) >= n_stored or min(steps) < -n_stored:
        raise ValueError(f"{objective}: steps {steps} must index the {n_stored} stored steps")
    guidance = train_guidance if train_guidance is not None else batch.guidance
    return StoredSteps(kernel, kcfg, steps, guidance)


def clipped_advantages(batch: TrainBatch, adv_clip_max: float) -> tuple[Tensor, Tensor]:
    """(A clamped to ±adv_clip_max with NaN → 0, the 0/1 weights of the samples that count), on the latents' device."""
    keep = batch.weights().to(batch.traj.x.device)
    adv = torch.nan_to_num(batch.advantages.float()).clamp(-adv_clip_max, adv_clip_max).to(keep.device)
    return adv, keep


@dataclass
class StepScore:
    """Stored step j re-scored under the "train" weights: its σ's, the transition (μ_θ, s) and log π_θ − log π_old."""

    x: Tensor
    x_next: Tensor
    sigma: Tensor
    sigma_next: Tensor
    out: Any                 # flowrl.types.StepOut: mean μ_θ (differentiable), std s
    log_ratio: Tensor        # (B,)


def score_step(policy, batch: TrainBatch, j: int, how: StoredSteps) -> StepScore:
    """v_θ at stored step j, μ_θ and s from the rollout's kernel, log π_θ(x_{j+1}) − log π_old (module docstring)."""
    tr = batch.traj
    x, xn, s, sn = tr.x[:, j].float(), tr.x_next[:, j].float(), tr.sigma[:, j].float(), tr.sigma_next[:, j].float()
    with policy.adapter("train"):
        v = policy.velocity(x, s, batch.cond, how.guidance)
    out = how.kernel.step(x, v.float(), s, sn, x_next=xn, cfg=how.kernel_cfg)
    logp = how.kernel.log_prob(xn, out.mean, out.std, batch.reduce, how.kernel_cfg)
    return StepScore(x, xn, s, sn, out, logp - tr.log_prob[:, j].float())


@torch.no_grad()
def reference_mean(policy, batch: TrainBatch, score: StepScore, how: StoredSteps,
                   adapter: str | None = None) -> Tensor:
    """μ of the same stored step under weight set ``adapter`` (None: the frozen base), without gradient."""
    with policy.adapter(adapter):
        v_ref = policy.velocity(score.x, score.sigma, batch.cond, how.guidance)
    return how.kernel.step(score.x, v_ref.float(), score.sigma, score.sigma_next, x_next=score.x_next,
                           cfg=how.kernel_cfg).mean


def average_over_steps(steps: list[int], keep: Tensor, terms: Callable[[int], dict[str, Tensor]]) -> dict[str, Tensor]:
    """{name: Σ_j masked_mean(term_j, keep) / |steps|} for the per-sample terms ``terms(j)`` of every step j."""
    sums: dict[str, Tensor] = {}
    for j in steps:
        for name, per in terms(j).items():
            sums[name] = sums.get(name, 0.0) + masked_mean(per, keep) / len(steps)
    return sums


def policy_terms(sc: StepScore, adv: Tensor, clip_range: float) -> dict[str, Tensor]:
    """Per-sample PPO-clip terms of a re-scored step: policy loss, ratio, clipped flag, approx KL."""
    ratio = torch.exp(sc.log_ratio)
    return {"policy": clipped_surrogate(adv, ratio, clip_range), "ratio": ratio.detach(),
            "clipped": ((ratio - 1).abs() > clip_range).float(), "approx_kl": 0.5 * sc.log_ratio.detach() ** 2}


def _step_terms(policy, batch: TrainBatch, j: int, how: StoredSteps, cfg: Config, adv: Tensor):
    """Per-sample policy / ratio / KL terms of stored step j (module docstring)."""
    sc = score_step(policy, batch, j, how)
    terms = policy_terms(sc, adv, cfg.clip_range)
    if batch.traj.is_weight is not None:         # decoupled rollout correction: ℓ_i ← W_ij·ℓ_i (detached W)
        terms["policy"] = terms["policy"] * batch.traj.is_weight[:, j].to(terms["policy"].device)
    if cfg.beta_kl > 0:
        mean_ref = reference_mean(policy, batch, sc, how)
        terms["kl"] = mean_kl(sc.out.mean, mean_ref, sc.out.std, sc.sigma_next - sc.sigma, cfg.kl_form)
    return terms


METRIC_NAMES = {"clipped": "clipfrac"}   # summed per-sample term → logged metric name


def loss_out(sums: dict[str, Tensor], beta_kl: float) -> LossOut:
    """total = policy + β·kl; metrics ``policy_loss`` and every other summed term, detached."""
    total = sums["policy"] + (beta_kl * sums["kl"] if "kl" in sums else 0.0)
    metrics = {"policy_loss": sums["policy"].detach()}
    metrics.update({METRIC_NAMES.get(k, k): v.detach() for k, v in sums.items() if k != "policy"})
    return LossOut(total, metrics)


def trajectory_loss(policy, batch: TrainBatch, cfg: Any, objective: str, step_terms: Callable) -> LossOut:
    """The stored-step objectives' driver: ``step_terms(policy, batch, j, how, cfg, A)`` gives the per-sample
    terms of step j (``policy`` and, with β > 0, ``kl``); each is averaged over the samples that count and over
    the trained steps, and the loss is policy + cfg.beta_kl·kl."""
    how = stored_steps(batch, objective, cfg.train_guidance)
    adv, keep = clipped_advantages(batch, cfg.adv_clip_max)
    sums = average_over_steps(how.steps, keep, lambda j: step_terms(policy, batch, j, how, cfg, adv))
    return loss_out(sums, cfg.beta_kl)


def loss(policy, batch: TrainBatch, cfg: Config | None = None) -> LossOut:
    return trajectory_loss(policy, batch, cfg or Config(), "grpo", _step_terms)
