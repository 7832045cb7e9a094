"""The advantage stage: R (N, K) → A (N,) through the configured balancer, then the objective's own mapping.

Groups are the iteration's prompts (rows p·G … p·G + G − 1 share prompt p); a group may span processes, and
every process computes the same A from the gathered R. ±inf rewards are treated as not applicable (NaN) here;
a sample whose advantage is not finite is left out of the update. A balancer that needs more than the rewards
(MARBLE's and PCGrad's per-reward gradient Gram) declares ``needs_reward_gradients`` and asks ``services`` for it
(``flowrl.balancers.services``); any other balancer is handed ``NoServices``.

Conflict diagnostics (``advantage.diagnose_every`` = N > 0; MARBLE's measurement, arXiv 2605.06507): every N
iterations, whatever the balancer, the stage asks ``services.reward_gram`` for the (K+1)×(K+1) Gram of the
objective's gradients g_1 … g_K of each reward alone (its standardised advantages A_k = (R_k − mean_prompt)
/ (std R_k + 1e-4), through the objective's ``prepare_advantages``) and g of the advantages actually applied,
and logs

    balance/cos_<reward> = g_k·g / (|g_k| |g|)      (omitted when g_k = 0 on the Gram's micro-batch)
    balance/neg_cos_any  = 1 if some cos < 0 else 0  (its mean over a run = the fraction of diagnosed batches
                                                      in which some reward's gradient opposes the update)
    balance/cos_min, balance/diagnose_s (the seconds the K + 1 extra backward passes took).

g is the exact gradient of the applied advantages on that micro-batch, so the figure needs no assumption about
how the balancer mixes (for Σ_k α_k A_k with an affine loss it equals (Gα)_k/√(G_kk αᵀGα)). The Gram requests
do not touch the weights, the optimiser or any random stream: training is the same with diagnostics on or off.
Balancers report their effective per-reward weights as ``alpha_<k>`` (logged ``adv/alpha_<k>``).
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor

from flowrl.balancers.advantages import zero_std_ratio
from flowrl.balancers.services import NoServices, standardized_advantages


def update_cosines(gram: Tensor) -> Tensor:
    """cos(g_k, g) (K,) from the Gram of [g_1, …, g_K, g] ((K+1, K+1), g last); NaN where a norm is 0."""
    G = gram.double()
    norms = torch.diagonal(G).clamp(min=0).sqrt()
    cos = G[:-1, -1] / (norms[:-1] * norms[-1])
    ok = (norms[:-1] > 0) & (norms[-1] > 0) & torch.isfinite(cos)
    return torch.where(ok, cos, torch.full_like(cos, float("nan")))


class AdvantageStage:
    def __init__(self, balancer, balancer_cfg, reward_weights: Tensor, objective, objective_cfg,
                 state: dict, *, prompts_per_iter: int, group_size: int, diagnose_every: int = 0,
                 reward_names: Sequence[str] | None = None):
        self.balancer, self.bcfg, self.weights = balancer, balancer_cfg, reward_weights
        self.objective, self.ocfg, self.state = objective, objective_cfg, state
        self.groups = torch.arange(prompts_per_iter).repeat_interleave(group_size)
        if diagnose_every < 0:
            raise ValueError(f"advantage.diagnose_every must be ≥ 0 (0: off), got {diagnose_every}")
        self.diagnose_every = diagnose_every
        self.names = list(reward_names) if reward_names is not None else None
        self.calls = 0

    def run(self, R: Tensor, services, iteration: int | None = None, context=None) -> tuple[Tensor, dict]:
        """A (N,) for the whole iteration, and the advantage metrics (plus the conflict diagnostics on the
        iterations ``iteration % diagnose_every == 0``; without ``iteration`` the stage counts its calls).
        ``context`` (``flowrl.objectives.context.AdvantageContext``) is shown to the objective's mapping."""
        it = self.calls if iteration is None else iteration
        self.calls += 1
        finite = torch.where(torch.isinf(R), torch.full_like(R, float("nan")), R)
        offered = services if self.balancer.needs_reward_gradients else NoServices()
        adv, diag = self.balancer.balance(finite, self.groups, self.weights, self.state, self.bcfg,
                                          services=offered)
        adv = self.objective.prepare_advantages(adv, self.groups, self.ocfg, context)
        total = torch.nansum(torch.where(torch.isfinite(finite), finite, torch.zeros_like(finite)), 1)
        metrics = {"adv/mean": torch.nanmean(adv), "adv/abs_mean": torch.nanmean(adv.abs()),
                   "adv/zero_std_frac": zero_std_ratio(total, self.groups)}
        metrics.update({f"adv/{k}": v for k, v in diag.items() if torch.as_tensor(v).numel() == 1})
        if self.diagnose_every and it % self.diagnose_every == 0:
            metrics.update(self.diagnose(finite, adv, services))
        return adv, metrics

    def diagnose(self, R: Tensor, adv: Tensor, services) -> dict:
        """balance/cos_<reward>, neg_cos_any, cos_min and diagnose_s (see the module docstring)."""
        t0 = time.perf_counter()
        A_k = standardized_advantages(R, self.groups)
        prep = self.objective.prepare_advantages
        cols = [prep(A_k[:, k], self.groups, self.ocfg) for k in range(R.shape[1])]
        gram = services.reward_gram(torch.stack([*cols, adv.to(A_k.dtype)], dim=1))
        cos = update_cosines(gram.detach().cpu())
        names = self.names or [str(k) for k in range(R.shape[1])]
        out = {f"balance/cos_{n}": float(c) for n, c in zip(names, cos.tolist()) if c == c}
        valid = cos[torch.isfinite(cos)]
        out["balance/neg_cos_any"] = float(bool((valid < 0).any()))
        if valid.numel():
            out["balance/cos_min"] = float(valid.min())
        out["balance/diagnose_s"] = time.perf_counter() - t0
        return out
