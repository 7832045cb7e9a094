"""FAMO — fast adaptive multitask optimisation from per-reward loss values only, O(1) (Liu, Liu, Jin, Stone,
Liu, NeurIPS 2023, arXiv 2306.03792; Cranial-XIX/FAMO@250873e famo.py).

FAMO keeps task logits w (K,), weights z = softmax(w), and steps along Σ_k z_k ∇ log ℓ_k (its weighted loss
Σ_k z_k log ℓ_k / c, c = Σ_k z_k/ℓ_k a positive rescale). After the step it moves w by the change of the log
task losses, one Adam step (lr 0.025, L2 weight decay γ = 0.01, betas (0.9, 0.999), eps 1e-8):

    δ_k = log ℓ_k(before) − log ℓ_k(after),     d = J_softmax(w)ᵀ δ = z ⊙ (δ − zᵀδ),     w ← Adam(w, d)

so a reward whose loss fell less than the weighted average gains weight.

The task loss in this RL setting (the design of this module). The policy gradient of reward k with normalised
advantages A_k = (R_k − mean_prompt R_k)/s_k, s_k = std(R_k) + eps, is ∇J_k / s_k (J_k = E R_k). Take

    log ℓ_k = −J_k / s_k,      i.e.  ℓ_k = exp(−J_k / s_k) > 0, decreasing in the reward.

Then −∇ log ℓ_k is exactly reward k's normalised-advantage gradient, FAMO's direction Σ_k z_k ∇ log ℓ_k is
the gradient of the loss with A = Σ_k z_k A_k (Σ z = 1, so an affine objective's constant term comes out once,
as in MARBLE's amortized step), and log ℓ is scale-free as FAMO's log is: δ_k = (J̄_k^t − J̄_k^(t−1)) / s_k^(t−1), the
batch-mean gain of reward k between consecutive iterations in units of the spread its advantages were scaled
by (the same function ℓ^(t−1) before and after the step, as FAMO's update). J̄_k is the mean of the finite
R_k; δ_k = 0 when either mean is missing or s_k^(t−1) had no spread (A_k ≡ 0: reward k did not steer that
step). Named deviation: FAMO re-evaluates the task losses on the same batch after the step; here the "after"
value is the next iteration's rollouts (no extra sampling, O(1)), so δ carries prompt-to-prompt noise that the
small w-learning rate and Adam average out. Static ``weights`` fold into z and are renormalised.
State keys: ``w``, ``adam_m``, ``adam_v``, ``adam_step``, ``prev_mean``, ``prev_scale``, ``calls``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.balancers.advantages import finite_std
from flowrl.balancers.common import any_finite, check_inputs, check_mixing_weights, on_cpu, per_reward_advantages

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8      # torch.optim.Adam defaults, as FAMO's w optimiser uses them
NEEDS_REWARD_GRADIENTS = False       # the rewards alone (flowrl.contracts.Balancer)


@dataclass
class Config:
    w_lr: float = 0.025      # FAMO's learning rate of the task logits
    gamma: float = 0.01      # FAMO's regularisation: Adam L2 weight decay on w
    eps: float = 1e-4        # advantage std epsilon (s_k = std R_k + eps)

    def __post_init__(self):
        if self.w_lr <= 0 or self.gamma < 0:
            raise ValueError(f"famo needs w_lr > 0 and gamma ≥ 0, got w_lr={self.w_lr}, gamma={self.gamma}")


def reward_stats(R: Tensor) -> tuple[Tensor, Tensor]:
    """(mean (K,), population std (K,)) of each column's finite entries, float64; mean NaN if none."""
    mean = torch.full((R.shape[1],), float("nan"), dtype=torch.float64)
    std = torch.zeros(R.shape[1], dtype=torch.float64)
    for k in range(R.shape[1]):
        col = R[:, k][torch.isfinite(R[:, k])].double()
        if col.numel():
            mean[k], std[k] = col.mean(), finite_std(col)
    return mean, std


def log_loss_change(mean: Tensor, prev_mean: Tensor, prev_std: Tensor, eps: float) -> Tensor:
    """δ_k = log ℓ_k(before) − log ℓ_k(after) = (mean_k − prev_mean_k)/(prev_std_k + eps), 0 if undefined."""
    ok = torch.isfinite(mean) & torch.isfinite(prev_mean) & (prev_std > 0)
    delta = (mean - prev_mean) / (prev_std + eps)
    return torch.where(ok, delta, torch.zeros_like(delta))


def softmax_vjp(w: Tensor, delta: Tensor) -> Tensor:
    """d = (∂ softmax(w)/∂w)ᵀ δ = z ⊙ (δ − zᵀδ)  (FAMO's ``autograd.grad(softmax(w), w, grad_outputs=δ)``)."""
    z = torch.softmax(w, 0)
    return z * (delta - (z * delta).sum())


def adam_step(state: dict, grad: Tensor, cfg: Config) -> None:
    """One torch.optim.Adam step (L2 weight decay γ, bias correction) on state["w"], moments in the state."""
    b1, b2 = ADAM_BETAS
    w = state["w"]
    g = grad + cfg.gamma * w
    state["adam_step"] = t = state["adam_step"] + 1
    state["adam_m"] = m = b1 * state["adam_m"] + (1 - b1) * g
    state["adam_v"] = v = b2 * state["adam_v"] + (1 - b2) * g * g
    denom = (v / (1 - b2 ** t)).sqrt() + ADAM_EPS
    state["w"] = w - cfg.w_lr / (1 - b1 ** t) * m / denom


def update_logits(state: dict, mean: Tensor, std: Tensor, cfg: Config) -> Tensor:
    """Move w by the log-loss change since the previous call (none on the first call); return δ (K,)."""
    K = mean.shape[0]
    if "w" not in state:
        zeros = torch.zeros(K, dtype=torch.float64)
        state.update(w=zeros, adam_m=zeros.clone(), adam_v=zeros.clone(), adam_step=0)
        delta = zeros.clone()
    else:
        delta = log_loss_change(mean, state["prev_mean"].double(), state["prev_scale"].double(), cfg.eps)
        adam_step(state, softmax_vjp(state["w"].double(), delta), cfg)
    state["prev_mean"], state["prev_scale"] = mean, std
    return delta


@on_cpu
def balance(R: Tensor, group_ids: Tensor, weights=None, state: dict | None = None,
            cfg: Config | None = None, services=None) -> tuple[Tensor, dict]:
    cfg = cfg or Config()
    state = {} if state is None else state
    w_static = check_inputs(R, group_ids, weights).double()
    check_mixing_weights(w_static, "famo")
    K = R.shape[1]
    if "w" in state and state["w"].shape != (K,):
        raise ValueError(f"famo state has {state['w'].shape[0]} task logits for {K} rewards")
    mean, std = reward_stats(R)
    delta = update_logits(state, mean, std, cfg)
    state["calls"] = state.get("calls", 0) + 1
    mixed = torch.softmax(state["w"].double(), 0) * w_static
    mixed = mixed / mixed.sum()
    A_k = per_reward_advantages(R, group_ids, std="global", eps=cfg.eps, unbiased=False)
    adv = (torch.nan_to_num(A_k.double(), nan=0.0) * mixed).sum(dim=1).to(R.dtype)
    adv = torch.where(any_finite(R), adv, torch.full_like(adv, float("nan")))
    diag = {f"alpha_{k}": mixed[k].float() for k in range(K)}
    diag.update({f"loss_change_{k}": delta[k].float() for k in range(K)})
    return adv, diag
