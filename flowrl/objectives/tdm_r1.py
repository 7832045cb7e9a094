"""TDM-R1: few-step RL on a deterministic student path through a learned surrogate reward (Luo, Hu, Luo, Tang,
arXiv 2603.07700; code: Flow-Factory ``trainers/distillation/tdm_r1.py``, ``tdm.py``, ``distribution_matching.py``,
``group_preference.py`` @15932582 — the TDM-R1 repository itself ships no training code).

The student (the "train" weights) samples N deterministic Euler steps (the recipe's ``sampler.steps``, ODE kernel);
every boundary x_k = x_{σ_k}, k = 1..N, is one training unit (one ``TrainBatch``) and inherits the trajectory's
endpoint advantage A (clipped to ±``adv_clip_max``): on a deterministic path the reward of a state is the reward
of the image it maps to. Per unit, with σ_q ~ U(σ_k, σ_{k−1}) and z ~ N(0, I) drawn once per row:

  generator replay   v = v_θ(x_{k−1}, σ_{k−1}),  x̂ = x_{k−1} − σ_{k−1}v,  ε̂ = x_{k−1} + (1 − σ_{k−1})v
  re-noise (TDM)     a = (1−σ_q)/(1−σ_k),  β² = σ_q² − a²σ_k²,  m = (aσ_kε̂ + βz)/σ_q,  x_q = (1−σ_q)sg(x̂) + σ_q m
  fake TTUR          L_fake = mean_b ē((x̂_fake(x_q) − sg x̂)²)·imp·min(SNR(σ_q), γ),  SNR = ((1−σ)/σ)²,
                     imp = exp clamp(−½ē(m²) + ½ē(z²), ±log c)              (``ttur_fake_updates`` steps)
  surrogate          x_s = (1−σ_q)x_k + σ_q z,  ℓ = ē((v(x_s) − (z − x_k))²) for the surrogate S, its slow copy
                     and the reference R (the frozen base); ℓ̃^S = ℓ^S detached where ρ = exp(ℓ^slow − ℓ^S) left
                     the trust region (A > 0: ρ > 1 + c; A ≤ 0: ρ < 1 − c) or where it already moved the advantage's
                     way with (ℓ^S − ℓ^R)² > threshold;
                     L_surr = w_k [mean_i sg σ(s_g) A_i ℓ̃^S_i + β_ref ē_i (ℓ^S − ℓ^R)²],
                     s_g = β/|g| Σ_{i∈g} A_i (sg ℓ̃^S_i − ℓ^R_i),  w_k = (k + 1)/N  (FF's ramp: 0.5 … 1.25 for N = 4)
  generator          L = L_TDM + w·L_guid + (1 − w)·L_sreward, each a revised-x0 loss
                     R(c, r) = mean_b ē(ρ(x̂ − sg(x̂ + c))) / sg max(ē|x̂ − r|, 1e−8),  ρ(d) = ½d² (or pseudo-Huber)
                     L_TDM:     c = x̂_real − x̂_fake,                    r = x̂_real
                     L_guid:    c = λ/(s − 1)·(x̂_real − x̂_real(1)),       r = x̂_real   (absent when s ≤ 1 or λ = 0)
                     L_sreward: c = x̂_surr − x̂_real,                    r = x̂_surr
  with x̂_real = the base at guidance s (``real_guidance``), x̂_fake at guidance 1, x̂_surr at guidance s, all at x_q.

∂R/∂x̂ = −c/(D·B·norm) per element (squared form): the student's x̂0 moves along c. The reward model's gradient is
never used; the surrogate's learned preference is the reward direction. The slow copy follows the surrogate after
each iteration with decay min(0.3, 0.001 + 0.001·step) (FF updates it after each surrogate step, one per
acquisition). Departures from FF, for the one-objective loop: each unit runs its fake steps, one surrogate step and
then its generator loss (FF: the fake phase over all units, one surrogate step accumulated over the acquisition,
then the generator phase); one (σ_q, z) per unit is shared by the three phases (FF draws per phase); the surrogate
and the reference are both scored at guidance s (FF: the surrogate with the rollout's settings).

Roles are LoRA adapters of the policy (``policy.lora.names: [train, old, fake, surrogate, slow]``, so checkpoints
carry them); the fake and surrogate optimizers (AdamW, FF's ``TDM_R1_DEFAULT_OPTIMIZERS``) are the objective's own.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from flowrl.objectives.batch import TrainBatch, mean_elems
from flowrl.objectives.old_policy import OldUpdate, check_positive
from flowrl.objectives.sources import row_generators
from flowrl.types import LossOut

FAKE, SURROGATE, SLOW = "fake", "surrogate", "slow"
GROUP = "group"                           # extras key: each row's prompt group (the preference loss is group-wise)
OPTIMIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # policy → {role: AdamW}


@dataclass
class Config:
    tdm_weight: float = 0.3               # w: guidance reward vs surrogate reward (FF tdm_r1 hparams)
    cfg_reward_scale: float = 3.5         # λ of the guidance reward (FF)
    real_guidance: float = 3.0            # s: the real score's CFG (FF reference guidance; here the toy teacher's)
    surrogate_preference_beta: float = 1.0        # β of the group preference (FF)
    surrogate_reference_beta: float = 1.0e-3      # β_ref (FF)
    surrogate_reference_threshold: float = 0.05   # runaway clip (FF)
    surrogate_clip_range: float = 1.0e-3          # trust region against the slow copy (FF)
    slow_decay_min: float = 0.001                 # slow-copy decay min(max, min + 0.001·step) (FF)
    slow_decay_max: float = 0.3
    ttur_fake_updates: int = 5            # fake steps per unit (FF DMD2/TDM hparams)
    snr_gamma: float = 5.0                # γ, the fake loss's SNR cap (FF tdm_snr_gamma)
    importance_clip: float = 20.0         # c of the re-noise importance ratio (FF tdm_importance_clip)
    use_time_weighting: bool = True       # w_k = (k + 1)/N on the surrogate loss (FF)
    use_huber: bool = False               # ρ: ½d² (FF TDM-R1) or pseudo-Huber √(d² + κ²) − κ
    huber_c: float = 1.0e-3
    fake_lr: float = 3.0e-4               # FF TDM_R1_DEFAULT_OPTIMIZERS: fake AdamW 3e-4, β (0, 0.999)
    fake_betas: tuple[float, float] = (0.0, 0.999)
    surrogate_lr: float = 3.0e-4          # surrogate AdamW 3e-4, β (0.9, 0.999)
    surrogate_betas: tuple[float, float] = (0.9, 0.999)
    train_guidance: float | None = None   # the generator replay's CFG; None: the rollout's (a CFG-free student)
    adv_clip_max: float = 5.0             # FF advantage_clip_range
    old_update: OldUpdate = "on_policy"   # the student samples with its current weights

    def __post_init__(self):
        check_positive("tdm_r1", real_guidance=self.real_guidance,
                       snr_gamma=self.snr_gamma, importance_clip=self.importance_clip, fake_lr=self.fake_lr,
                       surrogate_lr=self.surrogate_lr, adv_clip_max=self.adv_clip_max)
        if self.ttur_fake_updates < 0:
            raise ValueError(f"tdm_r1 ttur_fake_updates must be >= 0, got {self.ttur_fake_updates}")
        if not 0.0 <= self.tdm_weight <= 1.0:
            raise ValueError(f"tdm_r1 tdm_weight must be in [0, 1], got {self.tdm_weight}")
        if not 0.0 <= self.slow_decay_min <= self.slow_decay_max < 1.0:
            raise ValueError(f"tdm_r1 needs 0 <= slow_decay_min <= slow_decay_max < 1, got "
                             f"{self.slow_decay_min}, {self.slow_decay_max}")


# --------------------------------------------------------------------------------------------- the source
@dataclass(frozen=True)
class DeterministicPath:
    """The rollout's deterministic path (every boundary state, ``RolloutResult.path``): one TrainBatch per
    boundary k = 1..N, whole prompt groups in one micro-batch (the group preference)."""

    stores_trajectory: bool = True        # an all-ODE rollout with ``store`` keeps its path
    together: str | None = GROUP
    offline: bool = False

    def check_kernel(self, objective: str, kernel: Any) -> None:
        if kernel.stochastic:
            raise ValueError(f"objective {objective!r} trains on the deterministic few-step path but "
                             f"sampler.kernel is {kernel.name!r}; set sampler.kernel.kind=ode")

    def batches(self, rollout, adv: Tensor, generator: torch.Generator, cfg: Any) -> list[TrainBatch]:
        res = rollout.result
        if res.path is None:
            raise ValueError("tdm_r1: the rollout stored no deterministic path (an all-ODE rollout with store)")
        gens = row_generators(generator, rollout.rows)
        return [TrainBatch(rollout.cond, adv, steps=[k], guidance=rollout.guidance, generator=gens,
                           extras=rollout.extras, path=res.path, grid=res.sigmas.to(res.path.device))
                for k in range(1, res.path.shape[1])]


TRAINS_ON = DeterministicPath()


def prepare_advantages(adv: Tensor, group_ids: Tensor, cfg: Config | None = None, context=None) -> Tensor:
    """Advantages unchanged; each row's prompt group as ``extras["group"]``."""
    if context is not None:
        context.extras[GROUP] = group_ids.clone()
    return adv


# ----------------------------------------------------------------------------------------- the formulas
def bcast(v: Tensor, like: Tensor) -> Tensor:
    return v.view(-1, *([1] * (like.dim() - 1))).to(like)


def conditional_renoise(x0: Tensor, eps: Tensor, sigma_mid: Tensor, sigma_t: Tensor, z: Tensor,
                        clip: float) -> tuple[Tensor, Tensor, Tensor]:
    """(x_{σ_t}, m, importance) of TDM's within-stage re-noising from σ_mid up to σ_t (module docstring)."""
    if bool((sigma_t <= sigma_mid).any()) or bool((sigma_mid < 0).any()) or bool((sigma_t >= 1).any()):
        raise ValueError("tdm_r1 re-noise needs 0 <= sigma_mid < sigma_t < 1")
    sm, st = bcast(sigma_mid, x0), bcast(sigma_t, x0)
    a = (1 - st) / (1 - sm)
    beta = (st ** 2 - (a * sm) ** 2).clamp(min=0).sqrt()
    m = (a * sm * eps + beta * z) / st
    log_imp = (-0.5 * mean_elems(m ** 2) + 0.5 * mean_elems(z ** 2)).clamp(-math.log(clip), math.log(clip))
    return (1 - st) * x0 + st * m, m, log_imp.exp()


def fake_loss(x_fake: Tensor, x_gen: Tensor, sigma: Tensor, importance: Tensor, gamma: float) -> Tensor:
    """mean_b ē((x̂_fake − sg x̂_gen)²)·imp·min(((1 − σ)/σ)², γ)."""
    snr = ((1 - sigma) / sigma) ** 2
    return (mean_elems((x_fake - x_gen.detach()) ** 2) * importance * snr.clamp(max=gamma)).mean()


def revised_x0_loss(x_hat: Tensor, c: Tensor, ref: Tensor, keep: Tensor, huber: float | None = None) -> Tensor:
    """Σ_b keep_b ē(ρ(x̂ − sg(x̂ + c)))/sg max(ē|x̂ − r|, 1e−8) / Σ keep (ρ = ½d², or pseudo-Huber with κ)."""
    d = x_hat - (x_hat + c).detach()
    rho = 0.5 * d ** 2 if huber is None else (d ** 2 + huber ** 2).sqrt() - huber
    norm = mean_elems((x_hat - ref).abs()).detach().clamp(min=1e-8)
    return (mean_elems(rho) / norm * keep).sum() / keep.sum().clamp(min=1.0)


def group_preference(values: Tensor, ref: Tensor, adv: Tensor, groups: Tensor, beta: float, keep: Tensor) -> Tensor:
    """FF's legacy group preference: mean_i sg σ(s_g) A_i ℓ_i, s_g = β/|g| Σ_{i∈g} A_i (sg ℓ_i − ℓ^R_i)."""
    _, inv = groups.unique(return_inverse=True)
    n = torch.zeros(int(inv.max()) + 1, device=values.device).index_add_(0, inv, keep)
    s = torch.zeros_like(n).index_add_(0, inv, keep * adv * (values.detach() - ref))
    w = torch.sigmoid(beta * s / n.clamp(min=1.0)).detach()[inv]
    return (w * adv * values * keep).sum() / keep.sum().clamp(min=1.0)


def trust_clip(values: Tensor, slow: Tensor, adv: Tensor, clip_range: float) -> tuple[Tensor, Tensor]:
    """(values detached where ρ = exp(ℓ^slow − ℓ) left [1 − c, 1 + c] on the advantage's side, the mask)."""
    if clip_range == 0.0:
        return values, torch.zeros_like(values, dtype=torch.bool)
    ratio = torch.exp(slow.detach() - values.detach())
    clipped = torch.where(adv > 0, ratio > 1 + clip_range, ratio < 1 - clip_range)
    return torch.where(clipped, values.detach(), values), clipped


def runaway_clip(values: Tensor, ref: Tensor, adv: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    """(values detached where they moved the advantage's way and (ℓ − ℓ^R)² > threshold, the mask)."""
    improved = torch.where(adv > 0, values < ref, values > ref)
    clipped = improved & ((values - ref) ** 2 > threshold)
    return torch.where(clipped, values.detach(), values), clipped


def time_weight(k: int, n: int, on: bool) -> float:
    """FF's boundary ramp (k + 1)/N for boundary k = 1..N (1 when off)."""
    return (k + 1) / n if on else 1.0


def slow_decay(step: int, cfg: Config) -> float:
    return min(cfg.slow_decay_max, cfg.slow_decay_min + 0.001 * step)


# ------------------------------------------------------------------------------------------ the phases
def require_roles(policy) -> None:
    missing = [r for r in (FAKE, SURROGATE, SLOW) if r not in policy.weight_sets()]
    if missing:
        raise ValueError(f"tdm_r1 needs LoRA adapters {missing}: set policy.lora.names: "
                         "[train, old, fake, surrogate, slow]")


def optimizer(policy, role: str, cfg: Config) -> torch.optim.Optimizer:
    """The role's own AdamW (made on first use; FF's published learning rates and betas)."""
    have = OPTIMIZERS.setdefault(policy, {})
    if role not in have:
        lr, betas = (cfg.fake_lr, cfg.fake_betas) if role == FAKE else (cfg.surrogate_lr, cfg.surrogate_betas)
        have[role] = torch.optim.AdamW(policy.adapter_parameters(role), lr=lr, betas=tuple(betas))
    return have[role]


def trainable(params: list, on: bool) -> None:
    for p in params:
        p.requires_grad_(on)


def role_step(policy, role: str, cfg: Config, loss_fn) -> Tensor:
    """One optimizer step of adapter ``role`` on ``loss_fn()``, whose forwards of ``role`` run through
    ``role_forward`` (an adapter switch re-freezes every adapter but "train", so the flag is set there)."""
    params = policy.adapter_parameters(role)
    try:
        value = loss_fn()
        trainable(params, True)
        grads = torch.autograd.grad(value, params, allow_unused=True)
    finally:
        trainable(params, False)
    opt = optimizer(policy, role, cfg)
    for p, g in zip(params, grads):
        p.grad = None if g is None else g.detach()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return value.detach()


def x0_of(policy, role: str | None, x: Tensor, sigma: Tensor, cond, guidance: float) -> Tensor:
    """x̂0 = x − σ·v under weight set ``role`` (None: the frozen base), without gradient."""
    with torch.no_grad(), policy.adapter(role):
        return x - bcast(sigma, x) * policy.velocity(x, sigma, cond, guidance).float()


def role_forward(policy, role: str, x: Tensor, sigma: Tensor, cond, guidance: float) -> Tensor:
    """v under adapter ``role`` with a graph to its parameters (inside ``role_step``)."""
    with policy.adapter(role):
        trainable(policy.adapter_parameters(role), True)
        return policy.velocity(x, sigma, cond, guidance).float()


def dsm_value(policy, role: str | None, x: Tensor, sigma: Tensor, target: Tensor, cond, guidance: float,
              grad: bool = False) -> Tensor:
    """ℓ = ē((v(x_σ) − target)²), the per-sample flow-matching error (the preference logit)."""
    if grad:
        return mean_elems((role_forward(policy, role, x, sigma, cond, guidance) - target) ** 2)
    with torch.no_grad(), policy.adapter(role):
        return mean_elems((policy.velocity(x, sigma, cond, guidance).float() - target) ** 2)


@dataclass
class Unit:
    """One boundary unit: states, σ's, the query draw, advantages and masks of a TrainBatch."""

    k: int
    n: int
    x_prev: Tensor
    x_b: Tensor
    s_prev: Tensor
    s_k: Tensor
    s_q: Tensor
    z: Tensor
    adv: Tensor
    keep: Tensor
    groups: Tensor
    cond: Any


def unit_of(batch: TrainBatch, cfg: Config) -> Unit:
    if batch.path is None or batch.grid is None or batch.steps is None:
        raise ValueError("tdm_r1: TrainBatch.path/grid/steps are None; the DeterministicPath source fills them")
    k, path = int(batch.steps[0]), batch.path.float()
    b, dev = path.shape[0], path.device
    gens = batch.generator if isinstance(batch.generator, (list, tuple)) else [batch.generator] * b
    u = torch.stack([torch.rand((), generator=g, device=g.device) for g in gens]).to(dev)
    z = torch.stack([torch.randn(path.shape[2:], generator=g, device=g.device) for g in gens]).to(dev)
    s_prev, s_k = batch.grid[k - 1].expand(b).float(), batch.grid[k].expand(b).float()
    s_q = s_k + (s_prev - s_k) * u.clamp(1e-4, 1 - 1e-4)      # σ_q ~ U(σ_k, σ_{k−1}), open interval
    keep = batch.weights().to(dev)
    adv = torch.nan_to_num(batch.advantages.float()).to(dev).clamp(-cfg.adv_clip_max, cfg.adv_clip_max) * keep
    groups = batch.extras.get(GROUP, torch.zeros(b, dtype=torch.long)).to(dev)
    return Unit(k, path.shape[1] - 1, path[:, k - 1], path[:, k], s_prev, s_k, s_q, z, adv, keep, groups,
                batch.cond)


def with_uncond(policy, cond, cfg: Config):
    """The conditioning with its unconditional half (encoded when a CFG-free rollout lacks it)."""
    if cond.uncond is not None or cfg.real_guidance <= 1.0:
        return cond
    from flowrl.types import Cond

    with torch.no_grad():
        return Cond(cond.embeds, policy.encode(list(cond.prompts), None, cfg=True).uncond, cond.prompts)


def surrogate_loss(policy, unit: Unit, cfg: Config, metrics: dict) -> Tensor:
    """L_surr of the unit on the surrogate adapter (call inside ``role_step``)."""
    x_s = (1 - bcast(unit.s_q, unit.x_b)) * unit.x_b + bcast(unit.s_q, unit.x_b) * unit.z
    target, s = unit.z - unit.x_b, cfg.real_guidance
    ref = dsm_value(policy, None, x_s, unit.s_q, target, unit.cond, s)
    slow = dsm_value(policy, SLOW, x_s, unit.s_q, target, unit.cond, s)
    val = dsm_value(policy, SURROGATE, x_s, unit.s_q, target, unit.cond, s, grad=True)
    trusted, trust = trust_clip(val, slow, unit.adv, cfg.surrogate_clip_range)
    held, runaway = runaway_clip(trusted, ref, unit.adv, cfg.surrogate_reference_threshold)
    pref = group_preference(held, ref, unit.adv, unit.groups, cfg.surrogate_preference_beta, unit.keep)
    penalty = ((val - ref) ** 2 * unit.keep).sum() / unit.keep.sum().clamp(min=1.0)
    metrics.update({"surrogate_trust_clip": trust.float().mean(), "surrogate_runaway_clip": runaway.float().mean(),
                    "surrogate_value_delta": (val - ref).detach().mean()})
    return time_weight(unit.k, unit.n, cfg.use_time_weighting) * (pref + cfg.surrogate_reference_beta * penalty)


def generator_terms(policy, batch: TrainBatch, unit: Unit, cfg: Config) -> dict[str, Tensor]:
    """The fake TTUR steps, the surrogate step, then the three generator losses of the unit."""
    guidance = batch.guidance if cfg.train_guidance is None else cfg.train_guidance
    with policy.adapter("train"):
        v = policy.velocity(unit.x_prev, unit.s_prev, batch.cond, guidance).float()
    sp = bcast(unit.s_prev, v)
    x_hat, eps_hat = unit.x_prev - sp * v, unit.x_prev + (1 - sp) * v
    x_q, _, imp = conditional_renoise(x_hat.detach(), eps_hat.detach(), unit.s_k, unit.s_q, unit.z,
                                      cfg.importance_clip)
    out: dict[str, Tensor] = {}
    for _ in range(cfg.ttur_fake_updates):
        out["fake_loss"] = role_step(policy, FAKE, cfg, lambda: fake_loss(
            x_q - bcast(unit.s_q, x_q) * role_forward(policy, FAKE, x_q, unit.s_q, unit.cond, 1.0), x_hat,
            unit.s_q, imp, cfg.snr_gamma))
    out["surrogate_loss"] = role_step(policy, SURROGATE, cfg, lambda: surrogate_loss(policy, unit, cfg, out))
    s, kappa = cfg.real_guidance, cfg.huber_c
    huber = kappa if cfg.use_huber else None
    real = x0_of(policy, None, x_q, unit.s_q, unit.cond, s)
    fake = x0_of(policy, FAKE, x_q, unit.s_q, unit.cond, 1.0)
    surr = x0_of(policy, SURROGATE, x_q, unit.s_q, unit.cond, s)
    out["tdm_loss"] = revised_x0_loss(x_hat, real - fake, real, unit.keep, huber)
    out["guidance_loss"] = torch.zeros((), device=v.device)
    if s > 1.0 and cfg.cfg_reward_scale != 0.0:
        cond_x0 = x0_of(policy, None, x_q, unit.s_q, unit.cond, 1.0)
        out["guidance_loss"] = revised_x0_loss(x_hat, cfg.cfg_reward_scale / (s - 1) * (real - cond_x0), real,
                                               unit.keep, huber)
    out["surrogate_reward_loss"] = revised_x0_loss(x_hat, surr - real, surr, unit.keep, huber)
    return out


def loss(policy, batch: TrainBatch, cfg: Config | None = None) -> LossOut:
    cfg = cfg or Config()
    require_roles(policy)
    unit = unit_of(batch, cfg)
    unit.cond = with_uncond(policy, batch.cond, cfg)
    t = generator_terms(policy, batch, unit, cfg)
    w = cfg.tdm_weight
    total = t["tdm_loss"] + w * t["guidance_loss"] + (1 - w) * t["surrogate_reward_loss"]
    metrics = {k: v.detach().float() for k, v in t.items()}
    metrics["policy_loss"] = total.detach()
    return LossOut(total, metrics)


def end_iteration(policy, cfg: Config, state: dict, step: int, metrics: dict | None = None) -> None:
    """slow ← d·slow + (1 − d)·surrogate, d = min(max, min + 0.001·iteration) (FF's ramp)."""
    require_roles(policy)
    it = state.get("iterations", 0)
    policy.soft_update_adapter(slow_decay(it, cfg), SURROGATE, SLOW)
    state["iterations"] = it + 1
