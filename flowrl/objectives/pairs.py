"""Preference pairs from rollout groups, and the sample sources of the flow-matching-loss objectives (Diffusion-DPO,
SFT / RAFT) that train at continuous logit-normal σ's.

Pairing rules (per prompt group, on a score s: the balancer's advantage or the weighted reward):
    best_worst   (argmax s, argmin s): one pair per group, the other G − 2 samples unused — what every anchor
                 does (verl-omni ``DPOLoss.build_online_dpo_pair_indices``, Flow-Factory
                 ``_form_pairs_from_advantages``, flow_grpo ``PerPromptStatTracker.update(type='dpo')``)
    all_pairs    every (i, j) in the group with s_i > s_j: G(G − 1)/2 pairs when no two scores tie (ours)
Ties: best_worst takes the first maximum and the last minimum in row order, so a group whose scores all tie
still gives a pair (its first and last rows) as verl-omni's stable descending sort does (flow_grpo forces (1, 0));
its gradient is then noise around the reference, as in the anchors. all_pairs takes strict pairs only, so a tied
group gives none there. A group of one sample can form no pair, which is refused (``check_groups``).

``PairedForward`` keeps each prompt group in one micro-batch (``together = "group"``, the ``extras`` key its
objective fills) and turns the micro-batch into TrainBatches of 2P rows, [winners; losers], where a pair shares one
σ and one ε drawn from the winner row's generator (Diffusion-DPO ``train.py`` L1044–1055; verl-omni
``repeat_interleave(2)``): with identical arms the two errors are then identical. ``LogitNormalForward`` is the
per-row version for SFT. σ ~ logit-normal(0, 1) on [0, 0.99] (``timesteps.logit_normal``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from flowrl.objectives.batch import TrainBatch
from flowrl.objectives.sources import row_generators
from flowrl.objectives.timesteps import logit_normal

RULES = ("best_worst", "all_pairs")
GROUP = "group"                     # the extras key of the prompt group (online) or the record (offline)


def check_groups(group_ids: Tensor, objective: str) -> None:
    """Refuse groups of one sample (no pair can be formed)."""
    _, counts = group_ids.unique(return_counts=True)
    if counts.numel() and int(counts.min()) < 2:
        raise ValueError(f"{objective}: a prompt group of {int(counts.min())} sample forms no preference pair; "
                         "set train.group_size >= 2")


def form_pairs(scores: Tensor, group_ids: Tensor, rule: str = "best_worst") -> tuple[Tensor, Tensor]:
    """(winner rows, loser rows) of every group by ``rule`` (module docstring); NaN scores take no part. Groups in
    order of first appearance, pairs within a group in row order."""
    if rule not in RULES:
        raise ValueError(f"pairing rule must be one of {RULES}, got {rule!r}")
    win, lose = [], []
    seen: list = []
    for g in group_ids.tolist():
        if g not in seen:
            seen.append(g)
    for g in seen:
        rows = torch.nonzero((group_ids == g) & torch.isfinite(scores)).flatten()
        s = scores[rows]
        if rows.numel() < 2:
            continue
        if rule == "best_worst":
            i = int(torch.nonzero(s == s.max())[0])
            j = int(torch.nonzero(s == s.min())[-1])
            win.append(int(rows[i]))
            lose.append(int(rows[j]))
            continue
        for a in range(rows.numel()):
            for b in range(rows.numel()):
                if s[a] > s[b]:
                    win.append(int(rows[a]))
                    lose.append(int(rows[b]))
    return torch.tensor(win, dtype=torch.long), torch.tensor(lose, dtype=torch.long)


def pair_scores(scores: Tensor, group_ids: Tensor, rule: str) -> Tensor:
    """``scores`` with NaN where a sample is in no pair: what the loop keeps (the rest is left out of the update)."""
    win, lose = form_pairs(scores, group_ids, rule)
    used = torch.zeros_like(scores, dtype=torch.bool)
    used[win], used[lose] = True, True
    return torch.where(used, scores, torch.full_like(scores, float("nan")))


def _noise(gens, shape, device) -> Tensor:
    return torch.stack([torch.randn(shape, generator=g, dtype=torch.float32, device=g.device) for g in gens]).to(device)


@dataclass(frozen=True)
class PairedForward:
    """Diffusion-DPO's source: pairs of one micro-batch (whole groups) → TrainBatches of [winners; losers] with a
    shared σ and ε per pair; ``cfg.samples_per_pair`` batches (Monte-Carlo terms, one backward each)."""

    stores_trajectory: bool = False
    together: str | None = GROUP
    offline: bool = False

    def check_kernel(self, objective: str, kernel: Any) -> None:
        """Any kernel can produce the clean samples."""

    def batches(self, rollout, adv: Tensor, generator: torch.Generator, cfg: Any) -> list[TrainBatch]:
        win, lose = form_pairs(adv.float(), rollout.extras[GROUP], cfg.pairs)
        if not win.numel():
            raise ValueError("dpo: a micro-batch without a preference pair (its groups' scores all tie)")
        x0 = rollout.result.latents
        rows = torch.cat([win, lose])
        gens = row_generators(generator, None if rollout.rows is None else rollout.rows[win])
        gens = gens if isinstance(gens, list) else [gens] * win.numel()
        roles = torch.cat([torch.ones(win.numel()), -torch.ones(lose.numel())])
        cond, both = rollout.cond.select(rows), x0[rows]
        out = []
        for _ in range(cfg.samples_per_pair):
            sigma = torch.stack([logit_normal(1, g, cfg.logit_mean, cfg.logit_std, 0.0, cfg.sigma_range)[0]
                                 for g in gens])
            eps = _noise(gens, x0.shape[1:], x0.device)
            out.append(TrainBatch(cond, roles, x0=both, sigma=torch.cat([sigma, sigma]).to(x0.device),
                                  noise=torch.cat([eps, eps]), guidance=rollout.guidance))
        return out


@dataclass(frozen=True)
class LogitNormalForward:
    """SFT's source: every row of the micro-batch at its own logit-normal σ and ε (its row generator);
    ``cfg.samples_per_row`` batches."""

    stores_trajectory: bool = False
    together: str | None = None
    offline: bool = False

    def check_kernel(self, objective: str, kernel: Any) -> None:
        """Any kernel can produce the clean samples."""

    def batches(self, rollout, adv: Tensor, generator: torch.Generator, cfg: Any) -> list[TrainBatch]:
        x0 = rollout.result.latents
        gens = row_generators(generator, rollout.rows)
        gens = gens if isinstance(gens, list) else [gens] * x0.shape[0]
        out = []
        for _ in range(cfg.samples_per_row):
            sigma = torch.stack([logit_normal(1, g, cfg.logit_mean, cfg.logit_std, 0.0, cfg.sigma_range)[0]
                                 for g in gens])
            out.append(TrainBatch(rollout.cond, adv, x0=x0, sigma=sigma.to(x0.device),
                                  noise=_noise(gens, x0.shape[1:], x0.device), guidance=rollout.guidance))
        return out


PAIRED_FORWARD = PairedForward()
LOGIT_NORMAL_FORWARD = LogitNormalForward()
