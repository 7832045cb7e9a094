"""The update stage: K epochs × U optimizer steps × micro-batches on one iteration's samples.

For epoch e the samples with a finite advantage are permuted by a generator seeded from (seed, iteration, e),
split into ``train.updates_per_epoch`` equal chunks, and each chunk into micro-batches of ``train.micro_batch``
(of whole units when the objective's source keeps rows ``together``: a Diffusion-DPO group never splits);
the objective's sample source turns a micro-batch into its TrainBatches (one per stored step or training σ):

    g = Σ_mb Σ_batch (|mb| / |chunk|)·∇ loss(batch) / #batches      (gradient accumulation: the chunk-mean loss)
    g ← mean over processes;  clip ‖g‖ ≤ train.max_grad_norm;  AdamW step;  eval-EMA update

A non-finite loss (or gradient norm) on any process skips that optimizer step on every process and names the
loss terms that were non-finite. Sharded (FSDP), every process makes the same number of forward/backward passes
per step, padding with zero-weight passes where it has fewer micro-batches (``Updater.accumulate``).
``RewardGradients`` is the loop's ``reward_gram`` service for balancers: the same loss on one micro-batch, handed
to the shared Gram computation of ``flowrl.balancers.services``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor

from samplers.rng import derived_generator


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


def update_generator(*parts) -> torch.Generator:
    """A CPU generator seeded from (seed, iteration, epoch, ...): resume replays the same training draws."""
    return derived_generator(*parts, namespace="flowrl-update")


def nonfinite_terms(loss: Tensor, metrics: dict) -> list[str]:
    """Names of the loss terms that are not finite ("loss" itself when only the total is)."""
    bad = [k for k, v in metrics.items() if not torch.isfinite(torch.as_tensor(v, dtype=torch.float32)).all()]
    return bad or (["loss"] if not torch.isfinite(loss).all() else [])


class Updater:
    """Optimizer steps of the objective on the "train" weights; ``run(samples, adv, keep, it, step)``."""

    def __init__(self, policy, objective, objective_cfg, optimizer, params, ema, dist, train_cfg, seed: int):
        self.policy, self.objective, self.ocfg = policy, objective, objective_cfg
        self.optimizer, self.params, self.ema, self.dist = optimizer, params, ema, dist
        self.t, self.seed = train_cfg, seed

    def loss(self, batch):
        return self.objective.loss(self.policy, batch, self.ocfg)

    def train_batches(self, samples, adv: Tensor, idx: Tensor, gen: torch.Generator) -> list:
        """The objective's TrainBatches of micro-batch ``idx`` (its ``TRAINS_ON`` source decides which)."""
        return self.objective.TRAINS_ON.batches(samples.rows(idx), adv[idx], gen, self.ocfg)

    def run(self, samples, adv: Tensor, keep: Tensor, iteration: int, global_step: int) -> UpdateStats:
        """The K × U optimizer steps of one iteration on this process's samples; returns their stats."""
        stats = UpdateStats()
        idx = torch.nonzero(keep).flatten()
        stats.add({"skip/samples_dropped": float((~keep).sum())})
        together = self.objective.TRAINS_ON.together
        units = unit_rows(idx, None if together is None else samples.extras[together][idx])
        for epoch in range(self.t.inner_epochs):
            order = torch.randperm(len(units), generator=update_generator(self.seed, iteration, epoch))
            perm = [units[int(i)] for i in order]
            for u, part in enumerate(split_units(perm, self.t.updates_per_epoch)):
                self.step(samples, adv, pack(part, self.t.micro_batch), (self.seed, iteration, epoch, u), stats,
                          global_step)
        return stats

    def accumulate(self, samples, adv: Tensor, mbs: list[Tensor], key: tuple, stats: UpdateStats) -> list[str]:
        """Backward every micro-batch ``mbs`` of one chunk; the names of non-finite loss terms (empty when all finite).

        Unsharded it stops at the first non-finite loss. Sharded, each forward and backward is a collective, so
        every process makes the same number of passes (``passes``): its micro-batches, then zero-weight passes on
        its first row with advantage 0 where another process has more (samples left out unevenly), and after a
        non-finite loss it goes on with zero weight (the step is then skipped on every process)."""
        rows = sum(mb.numel() for mb in mbs)
        passes, bad = self.passes(len(mbs)), []
        for m in range(passes):
            real = m < len(mbs)
            mb = mbs[m] if real else torch.zeros(1, dtype=torch.long)
            batches = self.train_batches(samples, adv if real else torch.zeros_like(adv), mb,
                                         update_generator(*key))
            weight = mb.numel() / rows / len(batches) if real else 0.0
            for j, batch in enumerate(batches):
                bad = self.backward_pass(batch, weight, bad, m == passes - 1 and j == len(batches) - 1, stats)
                if bad and not self.dist.sharded:
                    return bad
        return bad

    def backward_pass(self, batch, weight: float, bad: list[str], last: bool, stats: UpdateStats) -> list[str]:
        """Forward and backward of ``batch`` scaled by ``weight`` (0 once a loss was non-finite, when a sharded
        process only keeps step with the others); the non-finite terms so far. Sharded, the step's gradients
        are reduce-scattered in its ``last`` pass (``Sharding.gradient_sync``)."""
        if self.dist.sharding is not None:
            self.dist.sharding.gradient_sync(last)
        with self.dist.autocast():
            out = self.loss(batch)
        bad = bad or (nonfinite_terms(out.loss, out.metrics) if weight else [])
        if bad and not self.dist.sharded:
            return bad
        weight = 0.0 if bad else weight
        self.dist.backward(out.loss * weight)
        if weight:
            stats.add({f"loss/{k}": v for k, v in out.metrics.items()} | {"loss/total": out.loss.detach()})
        return bad

    def passes(self, micro_batches: int) -> int:
        """Forward/backward passes of one optimizer step: this process's micro-batches, or, sharded, the most
        any process has (a gather of one number)."""
        if not self.dist.sharded:
            return micro_batches
        return int(self.dist.gather(torch.tensor([micro_batches])).max())

    def step(self, samples, adv: Tensor, mbs: list[Tensor], key: tuple, stats: UpdateStats, global_step: int) -> None:
        """Accumulate the gradients of one chunk's micro-batches and take one optimizer step (or skip it on every
        process)."""
        self.optimizer.zero_grad(set_to_none=True)
        bad = self.accumulate(samples, adv, mbs, key, stats)
        any_bad = bool(self.dist.sum(torch.tensor(float(bool(bad)))) > 0)
        if not any_bad:
            self.dist.average_gradients(self.params)
            self.dist.unscale_gradients(self.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.t.max_grad_norm)
            any_bad = not bool(torch.isfinite(norm))
            bad = [] if not any_bad else ["grad_norm"]
        if any_bad:
            self.optimizer.zero_grad(set_to_none=True)
            stats.skipped_steps += 1
            stats.nonfinite_terms += bad or ["other_process"]
            self.dist.print(f"[flowrl] skipped an optimizer step: non-finite {', '.join(bad or ['loss elsewhere'])}")
            return
        stats.add({"train/grad_norm": norm, "train/lr": self.optimizer.param_groups[0]["lr"]})
        self.dist.optimizer_step(self.optimizer)
        if self.ema is not None:
            self.ema.update(global_step + stats.steps)
        stats.steps += 1


def unit_rows(idx: Tensor, keys: Tensor | None) -> list[Tensor]:
    """The rows ``idx`` as units that must share a micro-batch: one row each, or (``keys``: the source's
    ``together`` extras of the same rows) the rows of each key value, in order of first appearance."""
    if keys is None:
        return [idx[i:i + 1] for i in range(idx.numel())]
    units: dict = {}
    for row, k in zip(idx.tolist(), keys.tolist()):
        units.setdefault(k, []).append(row)
    return [torch.tensor(rows, dtype=torch.long) for rows in units.values()]


def split_units(units: list[Tensor], parts: int) -> list[list[Tensor]]:
    """``units`` in ``parts`` consecutive chunks sized as ``tensor_split`` sizes them (the first n mod parts one
    longer; empty ones kept, each still an optimizer step)."""
    q, extra = divmod(len(units), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + q + (i < extra)
        out.append(units[start:end])
        start = end
    return out


def pack(units: list[Tensor], micro_batch: int) -> list[Tensor]:
    """Micro-batches of whole units, each at most ``micro_batch`` rows unless one unit alone is larger. With
    one-row units this is ``cat(units).split(micro_batch)``."""
    out, cur, size = [], [], 0
    for u in units:
        if cur and size + u.numel() > micro_batch:
            out.append(torch.cat(cur))
            cur, size = [], 0
        cur.append(u)
        size += u.numel()
    if cur:
        out.append(torch.cat(cur))
    return out


def gram_rows(A: Tensor, size: int) -> Tensor:
    """Rows of one micro-batch for the reward Gram: for each reward in turn, its first row with a finite advantage
    not yet taken (so a reward that applies to few samples — MARBLE's specialists — still has a gradient), then
    the remaining rows in order, ``max(size, K)`` rows at most; returned sorted."""
    n, k = A.shape
    picked: list[int] = []
    for j in range(k):
        rows = [int(i) for i in torch.nonzero(torch.isfinite(A[:, j])).flatten() if int(i) not in picked]
        if rows:
            picked.append(rows[0])
    rest = [i for i in range(n) if i not in picked]
    return torch.tensor(sorted((picked + rest)[:max(size, len(picked))]), dtype=torch.long)


class RewardGradients:
    """The ``reward_gram`` service of one iteration: K backward passes of the objective on one micro-batch of this
    process (``gram_rows``: every applicable reward represented; its first stored step / training σ), one per
    reward's advantages, averaged over processes (``services.gradient_gram``, or ``services.sharded_gradient_gram``
    when the policy is FSDP-sharded)."""

    def __init__(self, updater: Updater, samples, iteration: int):
        self.updater, self.samples, self.iteration = updater, samples, iteration

    def reward_gram(self, A_k: Tensor) -> Tensor:
        from flowrl.balancers.services import gradient_gram, sharded_gradient_gram

        up = self.updater
        A_local = A_k[up.dist.local_slice(A_k.shape[0])].to(torch.float32)
        idx = gram_rows(A_local, up.t.micro_batch)
        gen = derived_generator(up.seed, self.iteration, "gram")
        batch = up.train_batches(self.samples, A_local[:, 0], idx, gen)[0]

        def loss_of(adv: Tensor, mask: Tensor) -> Tensor:
            return up.loss(dataclasses.replace(batch, advantages=adv, mask=mask)).loss

        if up.dist.sharded:
            return sharded_gradient_gram(loss_of, A_local[idx], up.params, up.dist)
        return gradient_gram(loss_of, A_local[idx], up.params, reduce=up.dist.mean)
