"""Diffusion-DPO for rectified flow, online (pairs from each rollout group) or offline (a preference dataset)
(Wallace et al., arXiv 2311.12908 Eq. 14; the flow form of verl-omni ``DPOLoss.compute_loss``
``diffusion_algos.py`` L704–760, Flow-Factory ``trainers/common/dpo_objective.py``; SalesforceAIResearch/DiffusionDPO
``train.py`` L1119–1145 in ε-space).

For a pair (x0^w, x0^l) sharing one σ ~ logit-normal(0, 1) and one ε (``pairs.PairedForward``):
    x^a_σ = (1−σ)x0^a + σε,   u^a = ε − x0^a,   e(v, a) = mean_elems (v(x^a_σ) − u^a)²          (a ∈ {w, l})
    Δ_a = e(v_θ, a) − e(v_ref, a)            (v_ref: the frozen base, every adapter off — ``policy.adapter(None)``)
    z   = −β/2 · (Δ_w − Δ_l),      L = mean_pairs −log σ(z)
Logged: implicit rewards r_a = −β/2·Δ_a, margin r_w − r_l, implicit accuracy mean[z > 0], pairs per batch.
At θ = ref, L = ln 2 and ∇L = β/4·(∇e_w − ∇e_l); in general ∇L = β/2·σ(−z)·(∇e_w − ∇e_l).

β sits on the per-element-mean scale: 2000 (verl-omni and Flow-Factory defaults; verl-omni's Qwen-Image OCR
recipe 100, flow_grpo ``config/dpo.py`` 100, the official ε-space SD1.5/SDXL 5000). One σ per pair per step
(``samples_per_pair`` 1, Flow-Factory ``num_train_timesteps``). Online, each group gives its best-vs-worst pair
(``pairs: best_worst``, every anchor) or all ordered pairs (``all_pairs``), ranked by the balancer's advantage
(``pair_by: advantage``, Flow-Factory) or by the weighted reward (``reward``, verl-omni); samples in no pair are
left out of the update. Offline (``data``: a preference JSONL or folder, ``flowrl.data.preferences``), the loop
trains on the dataset's (chosen, rejected) latents without rollouts (``flowrl.objectives.offline``). Rollouts come
from the current weights (``old_update: on_policy``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from flowrl.objectives.batch import TrainBatch, mean_elems
from flowrl.objectives.old_policy import OldUpdate, check_positive
from flowrl.objectives.pairs import GROUP, PAIRED_FORWARD, RULES, check_groups, pair_scores
from flowrl.objectives.regression import forward_batch, velocity_at
from flowrl.types import LossOut

TRAINS_ON = PAIRED_FORWARD
PAIR_BY = ("advantage", "reward")


@dataclass
class Config:
    beta: float = 2000.0              # verl-omni diffusion_actor.yaml L47–48, Flow-Factory DPOTrainingArguments.beta
    pairs: str = "best_worst"         # "best_worst" (every anchor) | "all_pairs"
    pair_by: str = "advantage"        # "advantage" (Flow-Factory) | "reward" (verl-omni: the raw weighted reward)
    logit_mean: float = 0.0           # σ ~ logit-normal(mean, std) on [0, sigma_range] (Flow-Factory, verl-omni)
    logit_std: float = 1.0
    sigma_range: float = 0.99         # Flow-Factory timestep_range
    samples_per_pair: int = 1         # σ draws per pair per step (num_train_timesteps)
    train_guidance: float | None = 1.0    # policy and reference forwards without CFG
    data: str | None = None           # offline: a preference JSONL (or folder with preferences.jsonl); None online
    old_update: OldUpdate = "on_policy"

    def __post_init__(self):
        check_positive("dpo", beta=self.beta, logit_std=self.logit_std, sigma_range=self.sigma_range,
                       samples_per_pair=self.samples_per_pair)
        if self.pairs not in RULES:
            raise ValueError(f"dpo pairs must be one of {RULES}, got {self.pairs!r}")
        if self.pair_by not in PAIR_BY:
            raise ValueError(f"dpo pair_by must be one of {PAIR_BY}, got {self.pair_by!r}")


def trains_on(cfg: Config):
    """Online: ``PAIRED_FORWARD``; with ``cfg.data``: the offline preference source."""
    if cfg.data is None:
        return PAIRED_FORWARD
    from flowrl.objectives.offline import OfflineSource

    return OfflineSource(cfg.data, "pairs", PAIRED_FORWARD)


def dpo_terms(err_w: Tensor, err_l: Tensor, ref_w: Tensor, ref_l: Tensor, beta: float) -> dict[str, Tensor]:
    """Per-pair loss −log σ(z), z = −β/2·((e_w − e_ref,w) − (e_l − e_ref,l)), and the implicit rewards (P,)."""
    r_w, r_l = -beta / 2 * (err_w - ref_w.detach()), -beta / 2 * (err_l - ref_l.detach())
    z = r_w - r_l
    return {"loss": -F.logsigmoid(z), "z": z, "reward_chosen": r_w, "reward_rejected": r_l}


def prepare_advantages(adv: Tensor, group_ids: Tensor, cfg: Config | None = None, context=None) -> Tensor:
    """The pairing score per sample (NaN: in no pair), and the prompt groups as ``extras["group"]`` so the loop
    keeps each group in one micro-batch (``pairs``)."""
    cfg = cfg or Config()
    check_groups(group_ids, "dpo")
    scores = adv
    if cfg.pair_by == "reward" and context is not None:
        R = torch.nan_to_num(context.R.float())
        scores = (R * context.weights.to(R)).sum(1)
        scores = torch.where(torch.isfinite(adv), scores, torch.full_like(scores, float("nan")))
    if context is not None:
        context.extras[GROUP] = group_ids.clone()
    return pair_scores(scores.float(), group_ids, cfg.pairs)


def loss(policy, batch: TrainBatch, cfg: Config | None = None) -> LossOut:
    """``batch``: 2P rows [winners; losers] (``batch.advantages`` +1 then −1) sharing σ and ε pairwise."""
    cfg = cfg or Config()
    fb = forward_batch(batch, "dpo")
    n = len(batch) // 2
    roles = batch.advantages.float()
    if len(batch) % 2 or not (torch.all(roles[:n] > 0) and torch.all(roles[n:] < 0)):
        raise ValueError("dpo: a TrainBatch must hold [winners; losers] (advantages +1 then −1): pairs.PairedForward")
    v_theta = velocity_at(policy, "train", fb, batch.cond, cfg.train_guidance, grad=True)
    v_ref = velocity_at(policy, None, fb, batch.cond, cfg.train_guidance)
    err, ref = mean_elems((v_theta - fb.v) ** 2), mean_elems((v_ref - fb.v) ** 2)
    t = dpo_terms(err[:n], err[n:], ref[:n], ref[n:], cfg.beta)
    total = t["loss"].mean()
    metrics = {"policy_loss": total.detach(), "implicit_acc": (t["z"] > 0).float().mean().detach(),
               "margin": t["z"].mean().detach(), "reward_chosen": t["reward_chosen"].mean().detach(),
               "reward_rejected": t["reward_rejected"].mean().detach(), "pairs": torch.tensor(float(n))}
    return LossOut(total, metrics)
