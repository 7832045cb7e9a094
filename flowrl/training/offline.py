"""The offline stage: an iteration's rows from the objective's dataset instead of a rollout.

Built by the trainer in place of ``RolloutStage`` when the objective's source declares ``offline``
(``flowrl.objectives.offline.OfflineSource``). Iteration ``it`` trains on records ``it·M … (it+1)·M − 1`` of an
endless stream of epochs, each epoch a permutation of the dataset drawn from (seed, epoch), with
M = train.prompts_per_iter · train.group_size / rows_per_record (the online iteration's number of rows; a DPO pair
is two rows). Each process takes its contiguous share of the records. The rows' labels are their advantages
(``Samples.labels``: the loop skips the reward and advantage stages); the records' ``extras["group"]`` keeps a
pair in one micro-batch. ``rollout_nfe`` counts the NFEs spent making a record (its ``nfe``) the first time an
iteration uses it, so an offline method's budget includes its dataset.
"""
from __future__ import annotations

import torch

from flowrl.objectives.pairs import GROUP
from flowrl.training.rollout import Samples, record
from flowrl.types import RolloutResult


class OfflineStage:
    """``run(it)`` → the iteration's dataset rows as ``Samples`` (with ``labels``)."""

    def __init__(self, policy, source, sampler_cfg, dist, *, seed: int, rows_per_iter: int, negative_prompt: str):
        from samplers.engine import SampleSpec

        self.policy, self.source, self.dist, self.seed = policy, source, dist, seed
        self.data = source.records(policy)
        k = source.rows_per_record
        if rows_per_iter % k:
            raise ValueError(f"offline data: {rows_per_iter} rows per iteration (train.prompts_per_iter × "
                             f"train.group_size) do not make whole records of {k} rows")
        self.per_iter = rows_per_iter // k
        if self.per_iter % dist.world:
            raise ValueError(f"offline data: {self.per_iter} records per iteration do not split over {dist.world} "
                             "processes")
        s = sampler_cfg
        for name in ("tree", "pool", "restart"):
            if getattr(s, name) is not None:
                raise ValueError(f"sampler.{name} shapes a rollout, and an offline objective has none; set it to null")
        guidance = float(policy.default_guidance if s.guidance is None else s.guidance)
        self.spec = SampleSpec(s.steps, s.height, s.width, s.num_frames, guidance, negative_prompt)
        self.steps = s.steps

    @property
    def guidance(self) -> float:
        return self.spec.guidance

    def order(self, epoch: int) -> torch.Tensor:
        from samplers.rng import derived_generator

        return torch.randperm(len(self.data), generator=derived_generator(self.seed, epoch, namespace="flowrl-offline"))

    def positions(self, iteration: int) -> list[tuple[int, int]]:
        """(record index, stream position) of iteration ``iteration``'s records, this process's share."""
        n = len(self.data)
        stream = range(iteration * self.per_iter, (iteration + 1) * self.per_iter)
        mine = list(stream)[self.dist.local_slice(self.per_iter)]
        return [(int(self.order(p // n)[p % n]), p) for p in mine]

    def run(self, iteration: int) -> Samples:
        d, k = self.data, self.source.rows_per_record
        pos = self.positions(iteration)
        idx = torch.tensor([i for i, _ in pos], dtype=torch.long)
        prompts = [d.prompts[i] for i in idx.tolist() for _ in range(k)]
        meta = [dict(d.meta[i]) for i in idx.tolist() for _ in range(k)]
        latents = d.latents[idx].flatten(0, 1).to(self.dist.device)
        local = torch.arange(len(pos)).repeat_interleave(k) + self.dist.local_slice(self.per_iter).start
        cfg = self.spec.guidance > 1.0
        neg = [self.spec.negative_prompt or ""] * len(prompts) if cfg else None
        cond = self.policy.encode(prompts, neg, cfg=cfg)
        result = RolloutResult(latents, self.policy.sigmas(self.steps, latents))
        first = sum(int(d.nfe[i]) for i, p in pos if p < len(d))             # a record's NFEs count once
        nfe = int(self.dist.sum(torch.tensor(first)))
        return Samples(prompts, meta, local, cond, result, None, record(self.spec, cond, result), nfe,
                       {"rollout/forwards": nfe, "offline/records": len(pos) * self.dist.world},
                       extras={GROUP: local.clone()}, row_offset=k * self.dist.local_slice(self.per_iter).start,
                       labels=d.labels[idx].flatten().to(latents.device))
