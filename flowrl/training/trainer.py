"""The one online-RL loop for every model and objective (reference E §3.6, A §2.6, B §1.9).

    for it in range(start, cfg.train.iterations):
        prompts  = data.batch(it, P)                          # global list; this process takes its slice
        rollout  = sample with the "old" adapter               # per-sample generators, CFG per config;
                                                               #   GRPO: SDE kernel + stored trajectory,
                                                               #   NFT/AWR: deterministic CFG-free solver, x0 only
        pixels   = policy.decode(rollout.latents)
        R        = rewards(pixels)  → gathered over processes  # (N, K), NaN = not applicable
        A        = balancer(R, groups), clipped                # groups may span processes
        for epoch in range(K): for update in chunks: for micro-batch: objective.loss → backward
            (grads averaged over processes, clipped, AdamW step, eval-EMA update)
        "old" ← decay·old + (1 − decay)·train                  # copy (GRPO) or DiffusionNFT's soft update
        log; every eval.every: evaluate; every checkpoint.every: save (atomic, exact resume)

Robustness: samples whose advantage is non-finite are left out of the update (counted per reward); if none is
left, or a reward is ±inf, the update is skipped; a non-finite loss skips that optimizer step and names the
term. Resume restores weights ("train", "old"), optimizer, EMA, balancer state, counters and RNG; the data
position and every sample's noise are pure functions of (seed, iteration), so a resumed run continues bitwise
identically on CPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.distributed import processes as _dist
from flowrl.training import evaluation as io
from flowrl.balancers.advantages import zero_std_ratio
from flowrl.config import RunConfig, check_geometry, save_resolved
from flowrl.types import RewardInput
from flowrl.training.update import UpdateStats, optimizer_updates


@dataclass
class LoopState:
    """Counters that a checkpoint stores (plus weights, optimizer, EMA, balancer state and RNG)."""

    iteration: int = 0                 # next iteration to run (= data position)
    global_step: int = 0               # optimizer steps taken
    rollout_nfe: int = 0               # velocity evaluations per sample, summed over all rollout samples
    skipped_updates: int = 0
    consecutive_skips: int = 0
    wall_time: float = 0.0             # seconds spent in iterations (excludes evaluation)
    skip_reasons: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Samples:
    """This process's samples of one iteration."""

    prompts: list[str]
    meta: list[dict]
    group_ids: Tensor                  # (n,) global prompt index within the iteration
    cond: object                       # flowrl.types.Cond of the n samples
    result: object                     # flowrl.types.RolloutResult
    pixels: Tensor | None = None


def old_decay(schedule: str, step: int) -> float:
    """η of the sampling ("old") weights, old ← η·old + (1 − η)·train, at optimizer step ``step``
    (``flowrl.objectives.old_policy``: on_policy η = 0, DiffusionNFT nft η = min(0.001·step, 0.5), ...)."""
    from flowrl.objectives.old_policy import decay

    return decay(schedule, step)


class Trainer:
    """Builds every part from a ``RunConfig`` and runs the loop; ``run()`` returns the final summary."""

    def __init__(self, cfg: RunConfig, accelerator=None, policy=None):
        from flowrl.training.parts import build_parts

        self.cfg = cfg
        if accelerator is None:
            accelerator = _dist.make_accelerator(cfg.run.mixed_precision, cfg.run.cpu)
        self.dist = _dist.Dist(accelerator)
        check_geometry(cfg, self.dist.world)
        torch.manual_seed(cfg.run.seed)          # LoRA init and anything else drawn from the global RNG
        if cfg.run.threads is not None:
            torch.set_num_threads(cfg.run.threads)
        self.parts = build_parts(cfg, self.dist, policy)
        self.policy = self.parts.policy
        self.state = LoopState()
        self.policy.copy_adapter("train", "old")

    # ------------------------------------------------------------------------------------------ the loop
    def run(self) -> dict:
        cfg = self.cfg
        if cfg.run.resume:
            self.resume()
        elif self.dist.is_main:
            save_resolved(cfg)
        logger = io.make_logger(self, self.state.iteration if cfg.run.resume else None)
        summary = {}
        if cfg.eval.before and self.state.iteration == 0:
            summary["before"] = io.evaluate(self, 0, logger, "before")
        bar = io.progress(self, self.state.iteration, cfg.train.iterations, "train")
        for it in range(self.state.iteration, cfg.train.iterations):
            t0 = time.perf_counter()
            metrics = self.iteration(it)
            self.state.wall_time += time.perf_counter() - t0
            self.state.iteration = it + 1
            metrics.update(self.counters())
            if it % cfg.log.every == 0 or it + 1 == cfg.train.iterations:
                logger.log(metrics, step=it + 1)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics.get('reward/total/mean', float('nan')):.3f}")
            if cfg.eval.every and (it + 1) % cfg.eval.every == 0 and it + 1 < cfg.train.iterations:
                io.evaluate(self, it + 1, logger, f"step_{it + 1:06d}")
            if cfg.checkpoint.every and (it + 1) % cfg.checkpoint.every == 0:
                self.save()
        bar.close()
        self.save()
        if cfg.eval.after:
            summary["after"] = io.evaluate(self, self.state.iteration, logger, "after")
        logger.close()
        summary["state"] = self.state.as_dict()
        return summary

    def iteration(self, it: int) -> dict:
        """One rollout → reward → advantage → update → old-weights step; returns its metrics."""
        cfg = self.cfg
        samples = self.rollout(it)
        R, reward_metrics = self.score(samples)                 # R (N, K) over all processes
        adv, adv_metrics = self.advantages(R, it, samples)      # (N,)
        local = adv[self.dist.local_slice(adv.shape[0])]
        keep = torch.isfinite(local)
        metrics = {**reward_metrics, **adv_metrics}
        stats = UpdateStats()
        if self.update_allowed(R, adv, metrics):
            stats = optimizer_updates(self, samples, local, keep, it)
        metrics.update(stats.as_metrics())
        self.record_skips(stats)
        self.policy.soft_update_adapter(old_decay(cfg.train.old_update, self.state.global_step), "train", "old")
        return metrics

    # --------------------------------------------------------------------------------------- the pieces
    def rollout(self, it: int) -> Samples:
        """Sample this process's slice of the iteration's N = P·G samples with the "old" weights."""
        cfg, parts = self.cfg, self.parts
        P, G = cfg.train.prompts_per_iter, cfg.train.group_size
        items = parts.train_prompts.batch(it, P)
        sl = self.dist.local_slice(P * G)
        rows = list(range(P * G))[sl]
        prompts = [items[r // G][0] for r in rows]
        meta = [dict(items[r // G][1]) for r in rows]
        group_ids = torch.tensor([r // G for r in rows], dtype=torch.long)
        gens = [parts.generator(cfg.run.seed, it, r // G, r % G) for r in rows]
        with torch.no_grad(), self.dist.autocast():
            cond, result = parts.sample(self.policy, prompts, gens, it)
            pixels = parts.decode(self.policy, result.latents)
        self.state.rollout_nfe += int(result.nfe) * P * G
        return Samples(prompts, meta, group_ids, cond, result, pixels)

    def score(self, s: Samples) -> tuple[Tensor, dict]:
        """Rewards of this process's samples, gathered into R (N, K); per-reward metrics."""
        batch = RewardInput(s.pixels.float().clamp(0, 1), s.prompts, s.group_ids, s.meta)
        out = self.parts.rewards(batch)
        R = self.dist.gather(out.scores.float())
        metrics = {}
        for k, name in enumerate(out.names):
            col = R[:, k]
            ok = col[torch.isfinite(col)]
            metrics[f"reward/{name}/mean"] = ok.mean() if ok.numel() else float("nan")
            metrics[f"reward/{name}/std"] = ok.std(unbiased=False) if ok.numel() > 1 else 0.0
            metrics[f"reward/{name}/nonfinite"] = int((~torch.isfinite(col)).sum())
        total = self.dist.gather(out.total.float())
        ok = total[torch.isfinite(total)]
        metrics["reward/total/mean"] = ok.mean().item() if ok.numel() else float("nan")
        self.reward_names = list(out.names)
        return R, metrics

    def advantages(self, R: Tensor, it: int, samples: Samples | None = None) -> tuple[Tensor, dict]:
        """R (N, K) → A (N,) through the configured balancer (±inf rewards count as NaN here)."""
        cfg = self.cfg
        P, G = cfg.train.prompts_per_iter, cfg.train.group_size
        groups = torch.arange(P).repeat_interleave(G)
        finite = torch.where(torch.isinf(R), torch.full_like(R, float("nan")), R)
        adv, diag = self.parts.balance(finite, groups, samples, it)
        total = torch.nansum(torch.where(torch.isfinite(finite), finite, torch.zeros_like(finite)), 1)
        metrics = {"adv/mean": torch.nanmean(adv), "adv/abs_mean": torch.nanmean(adv.abs()),
                   "adv/zero_std_frac": zero_std_ratio(total, groups)}
        metrics.update({f"adv/{k}": v for k, v in diag.items() if torch.as_tensor(v).numel() == 1})
        return adv, metrics

    def update_allowed(self, R: Tensor, adv: Tensor, metrics: dict) -> bool:
        """False (and the reason recorded) when a reward is ±inf or no sample has a finite advantage."""
        bad = [n for k, n in enumerate(self.reward_names) if torch.isinf(R[:, k]).any()]
        if not bad and torch.isfinite(adv).any():
            return True
        reason = f"reward/{bad[0]}" if bad else "reward/" + "+".join(
            n for k, n in enumerate(self.reward_names) if torch.isnan(R[:, k]).any())
        self.skip(reason, metrics)
        return False

    def skip(self, reason: str, metrics: dict) -> None:
        self.state.skipped_updates += 1
        self.state.consecutive_skips += 1
        self.state.skip_reasons[reason] = self.state.skip_reasons.get(reason, 0) + 1
        metrics["skip/update"] = 1
        self.dist.print(f"[flowrl] skipped an update: non-finite {reason} "
                        f"({self.state.skipped_updates} skipped so far)")
        if self.state.consecutive_skips >= self.cfg.train.max_skipped:
            raise FloatingPointError(f"{self.state.consecutive_skips} consecutive updates skipped for non-finite "
                                     f"values (last: {reason}); see skip/* in metrics.jsonl. Lower train.lr or "
                                     "check the reward; raise train.max_skipped to tolerate more")

    def record_skips(self, stats: UpdateStats) -> None:
        for term in stats.nonfinite_terms:
            self.state.skip_reasons[f"loss/{term}"] = self.state.skip_reasons.get(f"loss/{term}", 0) + 1
        self.state.skipped_updates += stats.skipped_steps
        if stats.steps:
            self.state.consecutive_skips = 0
        elif stats.skipped_steps:
            self.state.consecutive_skips += 1
        self.state.global_step += stats.steps

    def counters(self) -> dict:
        s = self.state
        return {"train/iteration": s.iteration, "train/global_step": s.global_step,
                "train/rollout_nfe": s.rollout_nfe, "train/skipped_updates": s.skipped_updates,
                "time/wall": s.wall_time,
                "time/samples_per_s": s.iteration * self.cfg.samples_per_iter / max(s.wall_time, 1e-9)}

    # ------------------------------------------------------------------------------------ checkpoints
    def save(self) -> None:
        from flowrl.checkpoint.resume import save_run

        save_run(self)

    def resume(self) -> None:
        from flowrl.checkpoint.resume import load_run

        load_run(self)


def train(cfg: RunConfig, accelerator=None, policy=None) -> dict:
    """Run the RL loop described by ``cfg``; returns {"before", "after", "state"}."""
    return Trainer(cfg, accelerator, policy).run()

