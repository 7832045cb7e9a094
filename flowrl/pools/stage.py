"""Candidate pools (``sampler.pool``): N seeds per prompt, a cheap scout scores each, a selector keeps K, the
full policy regenerates the K from the same initial noise, and only those are scored and trained on (Sol-RL,
arXiv 2604.06916, NVlabs/Sana ``train_scripts/sol_rl``; docs/training.md "Candidate
pools").

One iteration, per prompt p of this process (whole prompts per process):

1. candidates j = 0..N−1, candidate j's noise from ``sample_generator(seed, iteration, p, j)``;
2. ``scout.score`` → (P, N) reward totals of the scout images (``flowrl.pools.scouts``); scout images are
   never trained on;
3. ``samplers.select.select(scores, K, mode)`` keeps K = ``train.group_size`` per prompt (ascending indices;
   random modes draw from a generator seeded by (seed, iteration));
4. the rollout stage regenerates the kept seeds with the sampling ("old") policy, the configured kernel
   and window, from the same initial noise — exactly the flat rollout of sample (p, j); an ``x0_exit`` (or
   ``full``) scout's kept candidates resume from its recorded prefix instead of recomputing it. With a
   deterministic kernel (NFT, AWR) the regenerated sample is the seed's full-policy ODE sample; with an SDE
   kernel (GRPO) it is a fresh SDE path from the seed's noise, so the scout ranks seeds, not SDE paths
   (except ``x0_exit`` / ``full``, whose prefix is the path itself);
5. the normal scoring stage scores the regenerated samples; the loop trains on them only.

``rollout_nfe`` counts scout and regeneration forwards. With N = K (and a scout that consumes no random state)
the pool is the plain recipe: the same rows, chunks and noise, so the same weights bit for bit (tested).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from flowrl.config.loader import Plugin, plugin_field
from flowrl.pools.scouts import Candidates
from flowrl.training.rollout import Samples, record

SCOUTS = "flowrl.pools.scouts:SCOUTS"


@dataclass
class PoolConfig:
    """Defaults: Sol-RL's published values (24-in-96 with ``train.group_size: 24``, NVFP4 6-step preview,
    best-worst selection)."""

    candidates: int = 96               # N seeds per prompt (num_image_per_prompt); K = train.group_size kept
    select: str = "best_worst"         # samplers.select.SELECTORS (Sol-RL stage-1 select mode)
    scout: Any = plugin_field(SCOUTS, "fp4")
    fidelity: bool = True              # score the kept samples in the stage too, for the scout↔regen metrics

    def __post_init__(self):
        from samplers.select import SELECTORS

        if self.candidates < 1:
            raise ValueError(f"pool.candidates must be >= 1, got {self.candidates}")
        if self.select not in SELECTORS:
            raise ValueError(f"pool.select must be one of {sorted(SELECTORS)}, got {self.select!r}")


def fidelity_metrics(scout: Tensor, regen: Tensor) -> dict:
    """Scout ↔ regenerated reward agreement over each prompt's kept set ((P, K) each), means over prompts:
    Kendall τ-b, top / bottom hit rates and the kept contrast (halves ⌊K/2⌋ / K − ⌊K/2⌋; ``samplers.select``),
    the kept set's regenerated reward spread (population std)."""
    from samplers.select import kendall_tau_b, selected_contrast, top_bottom_hit_rate

    k = scout.shape[1]
    out = {"pool/kept_reward_std": float(regen.std(dim=1, unbiased=False).mean())}
    if k < 2 or not torch.isfinite(scout).all() or not torch.isfinite(regen).all():
        return out
    tau = kendall_tau_b(scout, regen)
    top, bottom = top_bottom_hit_rate(scout, regen, k // 2, k - k // 2) if k >= 2 else (tau, tau)
    contrast = selected_contrast(scout, regen, k // 2, k - k // 2)
    for name, v in (("kendall_tau", tau), ("top_hit", top), ("bottom_hit", bottom), ("contrast", contrast)):
        ok = v[torch.isfinite(v)]
        out[f"pool/{name}"] = float(ok.mean()) if ok.numel() else float("nan")
    return out


class PoolStage:
    """Scout → select → regenerate for one iteration (module docstring): the sampling engine, the pool config,
    the iteration layout, the step-plan function and the reward set are all it uses."""

    def __init__(self, engine, cfg: PoolConfig, layout, plan, rewards):
        from flowrl.pools.scouts import ScoutContext

        self.engine, self.cfg, self.layout = engine, cfg, layout
        if rewards is None:
            raise ValueError("sampler.pool: the scout needs the reward set; build RolloutStage with "
                             "rewards=parts.rewards")
        self.rewards, self.context = rewards, ScoutContext(engine, rewards, plan)
        scout = cfg.scout.config if isinstance(cfg.scout, Plugin) else cfg.scout
        self.scout = copy.deepcopy(scout)        # the scout's state (prefix, FP4 copy) belongs to this stage
        if cfg.candidates < layout.G:
            raise ValueError(f"sampler.pool.candidates ({cfg.candidates}) must be >= train.group_size "
                             f"({layout.G}), the candidates kept per prompt")

    def select(self, scores: Tensor, iteration: int) -> Tensor:
        from samplers.rng import derived_generator
        from samplers.select import select

        gen = derived_generator(self.layout.seed, iteration, namespace="flowrl-pool")
        return select(scores, self.layout.G, self.cfg.select, generator=gen)

    def run(self, iteration: int) -> Samples:
        lay, eng = self.layout, self.engine
        ids = lay.local_prompts("a candidate pool")
        items = lay.prompts.batch(iteration, lay.P)
        n = self.cfg.candidates
        cands = Candidates([items[p][0] for p in ids], [dict(items[p][1]) for p in ids], list(ids), n, lay.seed,
                           iteration)
        if any(m.get("images") for m in cands.meta):
            raise ValueError("sampler.pool: candidate pools do not pass prompts' source images to the scouts yet; "
                             "train image-conditioned prompts without sampler.pool")
        with torch.no_grad(), lay.dist.autocast():
            out = self.scout.score(self.context, cands, iteration)
            kept = self.select(out.scores, iteration)                     # (P_local, K) ascending
            rows = [p * n + int(j) for p in range(len(ids)) for j in kept[p]]
            wrap = self.scout.resume(rows) if self.scout.resumable else _Counter()
            prompts = cands.row_prompts(rows)
            regen_out = eng.sample(prompts, cands.generators(rows), self.context.plan(iteration), wrap=wrap,
                                   decode=True)
        cond, result, regen = regen_out.cond, regen_out.result, wrap.forwards
        meta = [dict(cands.meta[r // n]) for r in rows]
        group_ids = torch.tensor([cands.prompt_ids[r // n] for r in rows], dtype=torch.long)
        scale = lay.P // len(ids)
        nfe = (out.forwards + regen) * scale
        metrics = {"rollout/forwards": nfe, "pool/scout_forwards": out.forwards * scale,
                   "pool/regen_forwards": regen * scale,
                   "pool/scout_nfe_share": out.forwards / max(1, out.forwards + regen),
                   "pool/scout_all_std": float(out.scores.std(dim=1, unbiased=False).mean()), **out.metrics}
        samples = Samples(prompts, meta, group_ids, cond, result, regen_out.pixels, record(eng.spec, cond, result),
                          nfe, metrics, row_offset=ids[0] * lay.G if len(ids) else 0)
        if self.cfg.fidelity:
            metrics.update(self.fidelity(samples, out.scores, kept))
        return samples

    def fidelity(self, samples: Samples, scores: Tensor, kept: Tensor) -> dict:
        """Scout ↔ regenerated metrics of this process's prompts (the regenerated rewards computed here)."""
        from flowrl.types import RewardInput

        pixels = samples.pixels.float().clamp(0, 1)
        batch = RewardInput(pixels, samples.prompts, samples.group_ids, samples.meta)
        regen = torch.nan_to_num(self.rewards(batch).total.float().cpu(), nan=float("-inf"))
        return fidelity_metrics(torch.gather(scores, 1, kept.cpu()), regen.view(kept.shape))


class _Counter:
    """A ``wrap`` that counts the model rows of the regeneration (no resume) in ``forwards``."""

    def __init__(self):
        self.forwards = 0

    def __call__(self, chunk: slice, velocity_fn):
        def counted(x, sig):
            self.forwards += x.shape[0]
            return velocity_fn(x, sig)
        return counted
