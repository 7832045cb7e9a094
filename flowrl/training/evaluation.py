"""The evaluation stage: held-out prompts × ``eval.seeds`` sampled with the deterministic ODE on the "train"
weights (the eval EMA swapped in when enabled, Flow-GRPO's practice, ``flow_grpo/ema.py``), scored with the training
rewards and the ``eval.held_out`` monitors; grids + ``metrics.jsonl`` + ``index.html`` go to
``<run dir>/eval/<tag>/`` (``flowrl.eval.run_eval``). Only the main process evaluates, except in a sharded
(FSDP) run, where every process samples (the transformer's forwards are collectives) and only the main one
writes and logs.

Every evaluation also reports the hacking detectors (``eval/detect/*``, ``eval/diversity``) and the RMS of the
velocity per ODE step on the fixed evaluation noise (``eval/velocity_rms/mean``; RL inflates it under NFT, AWM
and DPO, arXiv 2606.27771). The "before" evaluation is the base: later evaluations raise ``eval/alarm/<stat>``
when a statistic leaves its band around it (``flowrl.eval.drift``); a resumed run reads the base back from
``metrics.jsonl``.
"""
from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from flowrl.eval.velocity_norm import velocity_norm


@contextmanager
def ema_weights(ema):
    """Evaluate with the EMA averages in the live parameters, then put the live values back."""
    if ema is None or ema.num_updates == 0:
        yield
        return
    ema.store()
    ema.copy_to()
    try:
        yield
    finally:
        ema.restore()


class VelocityMeter:
    """Wraps a policy so every ``velocity`` call records the per-sample RMS of v; all else is the policy's."""

    def __init__(self, policy):
        self._policy = policy
        self.rms: list[torch.Tensor] = []

    def __getattr__(self, name):
        return getattr(self._policy, name)

    def velocity(self, x, sigma, cond, guidance=None):
        v = self._policy.velocity(x, sigma, cond, guidance)
        self.rms.append(velocity_norm(v.detach()))
        return v

    def mean(self) -> float:
        return float(torch.cat(self.rms).mean()) if self.rms else float("nan")


class Evaluator:
    """``evaluate(step, tag, logger)`` → ``eval/<reward>/mean`` etc. (logged and returned)."""

    def __init__(self, policy, ema, eval_cfg, sampler_cfg, prompts, train_rewards, dist, run_dir: Path,
                 run_name: str, rollout_guidance: float):
        self.policy, self.ema, self.e, self.s = policy, ema, eval_cfg, sampler_cfg
        self.prompts, self.train_rewards, self.dist = prompts, train_rewards, dist
        self.run_dir, self.run_name = Path(run_dir), run_name
        self.guidance = sampler_cfg.eval_guidance if sampler_cfg.eval_guidance is not None else rollout_guidance
        self._rewards: dict | None = None
        self.base: dict | None = None      # the "before" summary, reference of the drift alarms

    def rewards(self) -> dict:
        """{name: reward} scored at evaluation: the training rewards plus the held-out monitors (built once)."""
        if self._rewards is None:
            from rewards import RewardSet

            table = {r.name: r for r in self.train_rewards.rewards}
            extra = [n for n in self.e.held_out if n not in table]
            if extra:
                held = RewardSet({n: 1.0 for n in extra}, device=self.dist.device)
                table.update({r.name: r for r in held.rewards})
            table.update(self.prompts.eval_metrics())
            self._rewards = table
        return self._rewards

    def load_base(self) -> None:
        """The base summary of a resumed run: the step-0 evaluation record of its metrics.jsonl, if any."""
        from flowrl.training.metrics_log import read_metrics

        path = self.run_dir / "metrics.jsonl"
        recs = read_metrics(path) if path.is_file() else []
        self.base = next((r for r in recs if r.get("step") == 0 and any(k.startswith("eval/") for k in r)), None)

    def evaluate(self, step: int, tag: str, logger) -> dict:
        """Evaluate on the main process (``<run dir>/eval/<tag>/``, logged); in a sharded run every other
        process runs the same evaluation too — each transformer call is a collective — into a scratch
        directory that is deleted, and logs nothing."""
        summary: dict = {}
        if self.dist.is_main:
            summary = self.sample_and_score(step, tag, self.run_dir / "eval" / tag)
            logger.log(summary, step=step)
        elif self.dist.sharded:
            with tempfile.TemporaryDirectory(prefix="flowrl-eval-") as scratch:
                self.sample_and_score(step, tag, Path(scratch))
        self.dist.barrier()
        return summary

    def compare(self, before: str = "before", after: str = "after") -> Path | None:
        """``<run dir>/eval/before_after.png`` (the two evaluations' first grid pages side by side: same prompts,
        same seeds) and ``eval/index.html`` linking every evaluation; main process only, None elsewhere or for
        video grids (``flowrl.eval.before_after``)."""
        from flowrl.eval.before_after import write_before_after

        if not self.dist.is_main:
            return None
        rows = max(1, min(8, self.e.grid_prompts))
        return write_before_after(self.run_dir / "eval", cols=len(self.e.seeds), rows=rows, tags=(before, after))

    def sample_and_score(self, step: int, tag: str, out_dir: Path) -> dict:
        """One evaluation into ``out_dir``: its summary (the first one is the drift alarms' base)."""
        from flowrl.eval import run_eval

        e, s = self.e, self.s
        items = self.prompts.fixed(e.num_prompts)
        meter = VelocityMeter(self.policy)
        with ema_weights(self.ema):
            summary = run_eval({"trained": (meter, "train")}, [p for p, _ in items], [m for _, m in items],
                               e.seeds, self.rewards(), out_dir, steps=s.eval_steps,
                               guidance=self.guidance, height=s.height, width=s.width, num_frames=s.num_frames,
                               batch_size=e.batch, rows_per_page=e.grid_prompts, step=step,
                               title=f"{self.run_name}: {tag}", base_stats=self.base)
        summary["eval/velocity_rms/mean"] = meter.mean()
        if self.base is None:
            self.base = summary
        return summary
