"""The one online-RL loop for every model and objective (flow_grpo ``train_sd3.py``,
DiffusionNFT ``train_nft_sd3.py``).

    for it in range(start, cfg.train.iterations):
        samples = rollout.run(it)                    # this process's slice of P·G samples, "old" adapter
        scores  = score_samples(rewards, samples)    # R (N, K) gathered over processes; NaN = not applicable
                                                     # (train.async_rewards: chunk k scored while k+1 samples)
        A       = advantages.run(R, services)        # balancer (asks the loop for services) → objective mapping
        stats   = updater.run(samples, A, ...)       # K epochs × U optimizer steps through the objective's source
        "old" ← η·old + (1 − η)·train                # η from the objective's old_update schedule
        log; every eval.every: evaluate; every checkpoint.every: save (atomic, exact resume)

Robustness (docs/training.md "Faults"): a ±inf reward is treated as NaN (the sample is left out, counted and
the reward named); samples whose advantage is non-finite are left out of the update; if none is left the update
is skipped; a non-finite loss skips that optimizer step and names the term. After ``train.max_skipped``
consecutive skipped updates the run saves a checkpoint and stops (``SkipLimitError``). Resume restores weights
("train", "old"), optimizer, EMA, balancer state, counters and RNG; the data position and every sample's noise
are pure functions of (seed, iteration), so a resumed run continues bitwise identically on CPU. A preemption
signal (``run.preempt_signals``) stops the loop after the current iteration with a checkpoint (``preemption``).
"""
from __future__ import annotations

import time

import torch
from torch import Tensor

from flowrl.checkpoint.resume import RunState, finish_saves, load_run, prepare_fresh_run, save_run
from flowrl.checkpoint.store import seed_global_rngs
from flowrl.config import ConfigError, RunConfig, check_geometry, save_resolved
from flowrl.config.validate import check_startable
from flowrl.distributed import processes as _dist
from flowrl.errors import SkipLimitError
from flowrl.objectives.context import AdvantageContext
from flowrl.training.advantage import AdvantageStage
from flowrl.training.evaluation import Evaluator
from flowrl.training.preemption import Preemption, config_changes
from flowrl.training.rollout import RolloutStage
from flowrl.training.scoring import score_samples
from flowrl.training.state import LoopState
from flowrl.training.update import RewardGradients, Updater, UpdateStats


class Trainer:
    """Builds every part and stage from a ``RunConfig`` and runs the loop; ``run()`` returns the final summary."""

    def __init__(self, cfg: RunConfig, accelerator=None, policy=None):
        from flowrl.training.parts import build_parts

        self.cfg = cfg
        if accelerator is None:
            accelerator = _dist.make_accelerator(cfg.run.mixed_precision, cfg.run.cpu)
        self.dist = _dist.Dist(accelerator, fsdp=cfg.dist.fsdp)          # fsdp: the policy is sharded (parts.py)
        check_geometry(cfg, self.dist.world)
        check_startable(cfg)                     # rewards, resolution, prompt files, policy path: before loading
        seed_global_rngs(cfg.run.seed)           # LoRA init and anything else drawn from the global RNGs
        if cfg.run.threads is not None:
            torch.set_num_threads(cfg.run.threads)
        self.parts = p = build_parts(cfg, self.dist, policy)
        self.policy, self.state = p.policy, LoopState()
        self.policy.copy_adapter("train", "old")
        t, seed = cfg.train, cfg.run.seed
        self.offline = p.objective.TRAINS_ON.offline          # rows from the objective's dataset, not a rollout
        if self.offline:
            from flowrl.training.offline import OfflineStage

            self.rollout = OfflineStage(p.policy, p.objective.TRAINS_ON, cfg.sampler, self.dist, seed=seed,
                                        rows_per_iter=t.prompts_per_iter * t.group_size,
                                        negative_prompt=cfg.data.negative_prompt)
        else:
            self.rollout = RolloutStage(p.policy, cfg.sampler, p.kernel, p.window, p.train_prompts, self.dist,
                                        seed=seed, prompts_per_iter=t.prompts_per_iter, group_size=t.group_size,
                                        chunk=cfg.sampler.chunk, negative_prompt=cfg.data.negative_prompt,
                                        store_trajectory=p.objective.TRAINS_ON.stores_trajectory,
                                        rewards=p.rewards)
        weights = torch.tensor([spec.weight for spec in cfg.rewards.values()], dtype=torch.float32)
        self.advantages = AdvantageStage(p.balancer, cfg.advantage.balancer.config, weights, p.objective,
                                         p.objective_cfg, p.balancer_state, prompts_per_iter=t.prompts_per_iter,
                                         group_size=t.group_size, diagnose_every=cfg.advantage.diagnose_every,
                                         reward_names=list(cfg.rewards))
        self.updater = Updater(p.policy, p.objective, p.objective_cfg, p.optimizer, p.params, p.ema, self.dist, t,
                               seed)
        self.evaluator = Evaluator(p.policy, p.ema, cfg.eval, cfg.sampler, p.eval_prompts, p.rewards, self.dist,
                                   cfg.run_dir, cfg.run.name, self.rollout.guidance)
        self.run_state = RunState(p.policy, p.optimizer, p.ema, p.balancer_state, p.objective_state, p.window,
                                  self.state, p.sharding)
        if t.async_rewards and self.rollout.strategy is not None:
            raise ConfigError("train.async_rewards scores the chunks of a flat rollout; sampler.tree / sampler.pool "
                              "score their own samples: set train.async_rewards=false")
        if cfg.checkpoint.async_save and p.sharding is None:
            raise ConfigError("checkpoint.async_save: asynchronous saves write the shards of a sharded run; set "
                              "dist.fsdp=true on several processes, or checkpoint.async_save=false")

    # ------------------------------------------------------------------------------------------ the loop
    def run(self) -> dict:
        """The loop; a preemption signal (``run.preempt_signals``) ends it after the current iteration with a
        checkpoint and ``summary["preempted"]`` (flowrl/training/preemption.py)."""
        cfg = self.cfg
        with Preemption(cfg.run.preempt_signals) as preempt:
            self.open_run_dir()
            logger = self.logger(self.state.iteration if cfg.run.resume else None)
            bar = self.progress(self.state.iteration, cfg.train.iterations)
            summary = {}
            try:
                if cfg.eval.before and self.state.iteration == 0:
                    summary["before"] = self.evaluator.evaluate(0, "before", logger)
                for it in range(self.state.iteration, cfg.train.iterations):
                    self.step(it, logger, bar)
                    if preempt.should_stop(self.dist):
                        break
                bar.close()
                self.save_once()
                path = finish_saves() or self.saved[1]        # an asynchronous last save completes here
                if preempt.should_stop(self.dist):
                    summary["preempted"] = self.preempted(preempt.received, path)
                elif cfg.eval.after:
                    summary["after"] = self.evaluator.evaluate(self.state.iteration, "after", logger)
                    if "before" in summary:
                        summary["before_after"] = self.evaluator.compare("before", "after")
            finally:
                bar.close()
                logger.close()
        summary["state"] = self.state.as_dict()
        return summary

    def step(self, it: int, logger, bar) -> None:
        """Iteration ``it`` with its logging, evaluation, checkpoint and skip guard."""
        cfg = self.cfg
        t0 = time.perf_counter()
        metrics = self.iteration(it)
        self.state.wall_time += time.perf_counter() - t0
        self.state.iteration = it + 1
        metrics.update(self.state.counters(cfg.samples_per_iter))
        if it % cfg.log.every == 0 or it + 1 == cfg.train.iterations or self.skip_limit_reached():
            logger.log(metrics, step=it + 1)
        bar.update(1)
        bar.set_postfix(reward=f"{metrics.get('reward/total/mean', float('nan')):.3f}")
        self.stop_if_skipping()
        if cfg.eval.every and (it + 1) % cfg.eval.every == 0 and it + 1 < cfg.train.iterations:
            self.evaluator.evaluate(it + 1, f"step_{it + 1:06d}", logger)
        if cfg.checkpoint.every and (it + 1) % cfg.checkpoint.every == 0:
            self.save()

    def open_run_dir(self) -> None:
        """Resume (the newest restorable checkpoint; with ``run.resume`` true or auto, a directory without any
        checkpoint starts at 0 and one whose checkpoints all fail is refused), or start fresh (refusing a
        directory that holds another run's checkpoints unless ``run.restart``); then write the resolved
        config.yaml, which follows the directory when it was moved and records overrides given at resume."""
        cfg = self.cfg
        if cfg.run.resume == "auto" and (changed := config_changes(cfg, cfg.run_dir / "config.yaml")):
            self.dist.print(f"[flowrl] run.resume=auto: the config differs from {cfg.run_dir}/config.yaml in "
                            f"{', '.join(changed[:8])}; continuing with the given values")
        if cfg.run.resume:                       # true or "auto": load_run starts at 0 when there is no checkpoint
            load_run(cfg.run_dir, self.run_state, self.dist)
            self.evaluator.load_base()
        else:
            prepare_fresh_run(cfg.run_dir, cfg.run.restart, self.dist)
        if self.dist.is_main:
            save_resolved(cfg)

    def iteration(self, it: int) -> dict:
        """One rollout → reward → advantage → update → old-weights step; returns its metrics."""
        if self.offline:                                    # a dataset source: no rewards; labels are advantages
            t0 = time.perf_counter()
            samples = self.rollout.run(it)
            self.state.rollout_nfe += samples.rollout_nfe
            rows, row_adv = samples.training_rows(samples.labels)
            times = {"time/rollout_s": time.perf_counter() - t0}
            return self.finish_iteration(rows, row_adv, dict(samples.metrics), True, it, times)
        samples, scores, times = self.sample_and_score(it)
        self.state.rollout_nfe += samples.rollout_nfe
        context = self.advantage_context(scores, samples)
        adv, adv_metrics = self.advantages.run(scores.R, RewardGradients(self.updater, samples, it), iteration=it,
                                               context=context)
        local = self.dist.local_slice(adv.shape[0])
        samples.extras = {k: v[local] for k, v in context.extras.items()}
        rows, row_adv = samples.training_rows(adv[local])
        metrics = {**scores.metrics, **adv_metrics, **samples.metrics}
        return self.finish_iteration(rows, row_adv, metrics, self.update_allowed(scores, adv, metrics), it, times)

    def finish_iteration(self, rows, row_adv: Tensor, metrics: dict, allowed: bool, it: int, times: dict) -> dict:
        """The update (when ``allowed``), the objective's hook and the old-weights step of iteration ``it``; the
        metrics with the stage times (``times`` and ``time/update_s``)."""
        p = self.parts
        t0 = time.perf_counter()
        stats = UpdateStats()
        if allowed:
            stats = self.updater.run(rows, row_adv, torch.isfinite(row_adv), it, self.state.global_step)
        metrics.update(stats.as_metrics())
        self.record_steps(stats)
        p.objective.end_iteration(self.policy, p.objective_cfg, p.objective_state, self.state.global_step, metrics)
        self.policy.soft_update_adapter(p.objective.old_decay(p.objective_cfg, self.state.global_step), "train", "old")
        return {**metrics, **times, "time/update_s": time.perf_counter() - t0}

    def sample_and_score(self, it: int):
        """The rollout and its rewards: scored after the rollout, or (``train.async_rewards``) chunk by chunk in
        a worker thread while the next chunk samples (flowrl/training/async_scoring.py: the same R bit for bit).
        Also the stage times: ``time/rollout_s`` (with any overlapped scoring) and ``time/reward_s`` (the wait
        for the rewards after it)."""
        t0 = time.perf_counter()
        if not self.cfg.train.async_rewards:
            samples = self.rollout.run(it)
            t1 = time.perf_counter()
            scores = score_samples(self.parts.rewards, self.dist, samples)
        else:
            from flowrl.training.async_scoring import AsyncScorer

            with AsyncScorer(self.parts.rewards) as pending:
                samples = self.rollout.run(it, on_chunk=pending.submit)
                t1 = time.perf_counter()
                scores = pending.scores(samples, self.dist)
        return samples, scores, {"time/rollout_s": t1 - t0, "time/reward_s": time.perf_counter() - t1}

    # --------------------------------------------------------------------------------------- the pieces
    def advantage_context(self, scores, samples) -> AdvantageContext:
        """What the objective's advantage mapping may look at besides the balancer's output."""
        R = torch.where(torch.isinf(scores.R), torch.full_like(scores.R, float("nan")), scores.R)
        return AdvantageContext(R, self.advantages.weights, scores.names,
                                lambda: self.dist.gather(samples.pixels.float()), self.parts.objective_state,
                                meta=lambda: self.dist.gather_objects(samples.meta))

    def update_allowed(self, scores, adv: Tensor, metrics: dict) -> bool:
        """±inf rewards count as NaN (the advantage stage maps them; a sample no other reward applies to is left
        out): counted per reward (``skip/inf/<name>``, the checkpointed ``dropped_samples``) and named. False,
        with the update skipped and its reason recorded, when no sample has a finite advantage."""
        R, names = scores.R, scores.names
        for k, name in enumerate(names):
            n_inf = int(torch.isinf(R[:, k]).sum())
            if n_inf:
                metrics[f"skip/inf/{name}"] = n_inf
                key = f"reward/{name}"
                self.state.dropped_samples[key] = self.state.dropped_samples.get(key, 0) + n_inf
                self.dist.print(f"[flowrl] reward {name!r} returned ±inf for {n_inf} sample(s); treated as NaN "
                                "(not applicable): left out unless another reward applies")
        if torch.isfinite(adv).any():
            return True
        bad = [n for k, n in enumerate(names) if not torch.isfinite(R[:, k]).all()]
        self.skip("reward/" + "+".join(bad) if bad else "advantage", metrics)
        return False

    def skip(self, reason: str, metrics: dict) -> None:
        """Record a skipped update (the guard runs after the iteration: ``stop_if_skipping``)."""
        self.state.count_skip(reason)
        self.state.consecutive_skips += 1
        self.last_skip = reason
        metrics["skip/update"] = 1
        self.dist.print(f"[flowrl] skipped an update: non-finite {reason} "
                        f"({self.state.skipped_updates} skipped so far)")

    def record_steps(self, stats: UpdateStats) -> None:
        """Count the optimizer steps taken and skipped; a skipped step is a skipped update (reset by a step)."""
        for term in stats.nonfinite_terms:
            self.state.skip_reasons[f"loss/{term}"] = self.state.skip_reasons.get(f"loss/{term}", 0) + 1
            self.last_skip = f"loss/{term}"
        self.state.skipped_updates += stats.skipped_steps
        if stats.steps:
            self.state.consecutive_skips = 0
        else:
            self.state.consecutive_skips += stats.skipped_steps
        self.state.global_step += stats.steps

    def skip_limit_reached(self) -> bool:
        return self.state.consecutive_skips >= self.cfg.train.max_skipped

    def stop_if_skipping(self) -> None:
        """After ``train.max_skipped`` consecutive skipped updates (any cause): save a checkpoint — the weights
        are the last good ones, skipped steps never change them — and stop with a SkipLimitError."""
        if not self.skip_limit_reached():
            return
        self.save()
        path = finish_saves() or self.saved[1]
        where = f"checkpoint {path}" if path is not None else "a checkpoint"
        raise SkipLimitError(f"{self.state.consecutive_skips} consecutive updates skipped for non-finite values "
                             f"(last: {getattr(self, 'last_skip', 'unknown')}); stopped at iteration "
                             f"{self.state.iteration} after saving {where} of the last good weights. Fix the cause "
                             f"(lower train.lr, check the reward) and continue with --resume {self.cfg.run_dir}; "
                             f"train.max_skipped={self.cfg.train.max_skipped} is the limit")

    # ---------------------------------------------------------------------------------- I/O and state
    def logger(self, resume_step: int | None):
        from flowrl.config import to_dict
        from flowrl.training.metrics_log import MetricsLogger

        cfg = self.cfg
        return MetricsLogger(cfg.run_dir, is_main_process=self.dist.is_main, tensorboard=cfg.log.tensorboard,
                             wandb=cfg.log.wandb, wandb_project=cfg.log.project, run_name=cfg.run.name,
                             config=to_dict(cfg), resume_step=resume_step)

    def progress(self, start: int, total: int):
        from tqdm.auto import tqdm

        enabled = self.cfg.log.progress and self.dist.is_main
        return tqdm(total=total, initial=start, desc="train", disable=not enabled, dynamic_ncols=True)

    def save(self):
        """Checkpoint the current iteration; the checkpoint's path on the main process (None elsewhere)."""
        path = save_run(self.cfg.run_dir, self.run_state, self.cfg.checkpoint.keep, self.dist,
                        async_save=self.cfg.checkpoint.async_save)
        self.saved = (self.state.iteration, path)
        return path

    def save_once(self):
        """``save()`` unless this iteration was just saved: re-saving a step briefly removes it, and with
        ``checkpoint.keep: 1`` that would leave no checkpoint while a preempted run writes its last one."""
        done, path = getattr(self, "saved", (None, None))
        return path if done == self.state.iteration else self.save()

    def preempted(self, signal_name: str | None, path) -> dict:
        """Print how to resume a preempted run (main process); the summary's ``preempted`` entry."""
        cfg, it = self.cfg, self.state.iteration
        again = ("rerun the same command (run.resume=auto)" if cfg.run.resume == "auto" else
                 f"python scripts/train.py --resume {cfg.run_dir} (or rerun this command with run.resume=auto)")
        self.dist.print(f"[flowrl] preempted at iteration {it}: checkpoint {path}; resume with: {again}")
        return {"iteration": it, "signal": signal_name, "checkpoint": None if path is None else str(path)}


def train(cfg: RunConfig, accelerator=None, policy=None) -> dict:
    """Run the RL loop described by ``cfg``; returns {"before", "after", "state"}."""
    return Trainer(cfg, accelerator, policy).run()
