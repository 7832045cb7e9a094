"""The inner optimisation of one RL iteration: K epochs × U optimizer steps × micro-batches.

For epoch e the samples with a finite advantage are permuted by a generator seeded from (seed, iteration, e),
split into ``train.updates_per_epoch`` equal chunks, and each chunk into micro-batches of ``train.micro_batch``:

    g = Σ_mb (|mb| / |chunk|)·∇ loss(mb)         (gradient accumulation: the chunk-mean loss)
    g ← mean over processes;  clip ‖g‖ ≤ train.max_grad_norm;  AdamW step;  eval-EMA update

A non-finite loss (or gradient norm) on any process skips that optimizer step on every process and names the
loss terms that were non-finite (Flow-GRPO has no such guard; one bad reward used to poison the adapter).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class UpdateStats:
    steps: int = 0
    skipped_steps: int = 0
    nonfinite_terms: list[str] = field(default_factory=list)
    sums: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)

    def add(self, metrics: dict) -> None:
        for k, v in metrics.items():
            v = float(torch.as_tensor(v).float().mean())
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + 1

    def as_metrics(self) -> dict:
        out = {k: self.sums[k] / self.counts[k] for k in self.sums}
        out["train/optimizer_steps"] = self.steps
        out["skip/loss_steps"] = self.skipped_steps
        for term in self.nonfinite_terms:
            out[f"skip/loss/{term}"] = out.get(f"skip/loss/{term}", 0) + 1
        return out


def derived_generator(*parts) -> torch.Generator:
    """A CPU generator seeded from a tuple (seed, iteration, epoch, ...): resume replays the same draws."""
    digest = hashlib.sha256("|".join(map(str, ("flowrl-update", *parts))).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") % (1 << 63))


def nonfinite_terms(loss: Tensor, metrics: dict) -> list[str]:
    """Names of the loss terms that are not finite ("loss" itself when only the total is)."""
    bad = [k for k, v in metrics.items() if not torch.isfinite(torch.as_tensor(v, dtype=torch.float32)).all()]
    return bad or (["loss"] if not torch.isfinite(loss).all() else [])


def optimizer_updates(trainer, samples, adv: Tensor, keep: Tensor, iteration: int) -> UpdateStats:
    """Run the K × U optimizer steps of one iteration on this process's samples; returns their stats."""
    cfg = trainer.cfg
    stats = UpdateStats()
    idx = torch.nonzero(keep).flatten()
    stats.add({"skip/samples_dropped": float((~keep).sum())})
    for epoch in range(cfg.train.inner_epochs):
        perm = idx[torch.randperm(idx.numel(), generator=derived_generator(cfg.run.seed, iteration, epoch))]
        for u, chunk in enumerate(perm.tensor_split(cfg.train.updates_per_epoch)):
            one_step(trainer, samples, adv, chunk, (cfg.run.seed, iteration, epoch, u), stats)
    return stats


def one_step(trainer, samples, adv: Tensor, chunk: Tensor, key: tuple, stats: UpdateStats) -> None:
    """Accumulate the chunk's micro-batch gradients and take one optimizer step (or skip it).
    Each micro-batch is one backward per TrainBatch (per stored SDE step, or per training σ)."""
    cfg, parts, dist = trainer.cfg, trainer.parts, trainer.dist
    params = parts.params
    parts.optimizer.zero_grad(set_to_none=True)
    bad: list[str] = []
    for m, mb in enumerate(chunk.split(cfg.train.micro_batch)):
        batches = parts.train_batches(samples, adv, mb, derived_generator(*key, m))
        for batch in batches:
            with dist.autocast():
                out = parts.loss(trainer.policy, batch)
            bad = nonfinite_terms(out.loss, out.metrics)
            if bad:
                break
            parts.backward(out.loss * (mb.numel() / chunk.numel() / len(batches)))
            stats.add({f"loss/{k}": v for k, v in out.metrics.items()} | {"loss/total": out.loss.detach()})
        if bad:
            break
    any_bad = bool(dist.sum(torch.tensor(float(bool(bad)))) > 0)
    if not any_bad:
        dist.average_gradients(params)
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.train.max_grad_norm)
        any_bad = not bool(torch.isfinite(norm))
        bad = [] if not any_bad else ["grad_norm"]
    if any_bad:
        parts.optimizer.zero_grad(set_to_none=True)
        stats.skipped_steps += 1
        stats.nonfinite_terms += bad or ["other_process"]
        trainer.dist.print(f"[flowrl] skipped an optimizer step: non-finite {', '.join(bad or ['loss elsewhere'])}")
        return
    stats.add({"train/grad_norm": norm, "train/lr": parts.optimizer.param_groups[0]["lr"]})
    parts.optimizer.step()
    step = trainer.state.global_step + stats.steps
    if parts.ema is not None:
        parts.ema.update(step)
    stats.steps += 1
