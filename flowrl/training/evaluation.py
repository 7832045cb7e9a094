"""What the RL loop writes: the metrics logger, progress bars, and periodic evaluation with image grids.

Evaluation (``evaluate``) samples the held-out prompts × ``eval.seeds`` with the deterministic ODE on the
"train" weights (the eval EMA swapped in when enabled, Flow-GRPO's practice, reference A §2.4), scores them with
the training rewards and the ``eval.held_out`` monitors, and writes grids + ``metrics.jsonl`` + ``index.html``
into ``<run dir>/eval/<tag>/`` (``flowrl.eval.run_eval``). Only the main process evaluates.
"""
from __future__ import annotations

from contextlib import contextmanager

from flowrl.config.loader import to_dict


def make_logger(trainer, resume_step: int | None):
    from flowrl.training.metrics_log import MetricsLogger

    cfg = trainer.cfg
    return MetricsLogger(cfg.run_dir, is_main_process=trainer.dist.is_main, tensorboard=cfg.log.tensorboard,
                         wandb=cfg.log.wandb, wandb_project=cfg.log.project, run_name=cfg.run.name,
                         config=to_dict(cfg), resume_step=resume_step)


def progress(trainer, start: int, total: int, desc: str):
    from tqdm.auto import tqdm

    enabled = trainer.cfg.log.progress and trainer.dist.is_main
    return tqdm(total=total, initial=start, desc=desc, disable=not enabled, dynamic_ncols=True)


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


def eval_rewards(trainer) -> dict:
    """{name: reward} scored at evaluation: the training rewards plus the held-out monitors."""
    parts = trainer.parts
    if parts.eval_rewards is None:
        from rewards import RewardSet

        table = {r.name: r for r in parts.rewards.rewards}
        extra = [n for n in trainer.cfg.eval.held_out if n not in table]
        if extra:
            held = RewardSet({n: 1.0 for n in extra}, device=trainer.dist.device)
            table.update({r.name: r for r in held.rewards})
        table.update(parts.eval_prompts.eval_metrics())
        parts.eval_rewards = table
    return parts.eval_rewards


def evaluate(trainer, step: int, logger, tag: str) -> dict:
    """Evaluate on the held-out prompts; logs and returns ``eval/<reward>/mean`` etc."""
    from flowrl.eval import run_eval

    cfg, parts, dist = trainer.cfg, trainer.parts, trainer.dist
    summary: dict = {}
    if dist.is_main:
        items = parts.eval_prompts.fixed(cfg.eval.num_prompts)
        s = cfg.sampler
        with ema_weights(parts.ema):
            summary = run_eval({"trained": (trainer.policy, "train")}, [p for p, _ in items], [m for _, m in items],
                               cfg.eval.seeds, eval_rewards(trainer), cfg.run_dir / "eval" / tag,
                               steps=s.eval_steps, guidance=s.eval_guidance if s.eval_guidance is not None
                               else parts.guidance, height=s.height, width=s.width, num_frames=s.num_frames,
                               batch_size=cfg.eval.batch, rows_per_page=cfg.eval.grid_prompts, step=step,
                               title=f"{cfg.run.name}: {tag}")
        logger.log(summary, step=step)
    dist.barrier()
    return summary
