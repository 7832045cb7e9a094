"""The offline sample source: an objective that trains on a dataset (``flowrl.data.preferences``) instead of rollouts.

An objective's ``trains_on(cfg)`` returns ``OfflineSource(path, kind, inner)`` when its Config names a dataset
(``data``). The loop reads ``offline`` (True) and builds ``flowrl.training.offline.OfflineStage`` instead of the
rollout stage: no sampling, no reward, no advantage stage. The stage takes each iteration's records from
``records(policy)`` and hands their rows to the update like rollout rows; ``batches`` is the ``inner`` online
source's (Diffusion-DPO's pairs, SFT's logit-normal forward process), so the loss is the same function online
and offline.

    kind "pairs"   2 rows per record, [chosen, rejected], labels (+1, −1), ``extras["group"]`` = the record
    kind "images"  1 row per record (its chosen image: a demonstration), label 1
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

KINDS = {"pairs": 2, "images": 1}


@dataclass
class OfflineRecords:
    """The whole dataset as the stage reads it: R records of ``rows_per_record`` rows each."""

    prompts: list[str]
    meta: list[dict]
    latents: Tensor              # (R, rows_per_record, ...)
    labels: Tensor               # (R, rows_per_record) the rows' advantages
    nfe: Tensor                  # (R,) long: NFEs spent making each record

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass(frozen=True)
class OfflineSource:
    path: str
    kind: str
    inner: Any                   # the online source whose ``batches`` build the TrainBatches

    stores_trajectory: bool = False
    offline: bool = True

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"offline data kind must be one of {sorted(KINDS)}, got {self.kind!r}")

    @property
    def together(self) -> str | None:
        return self.inner.together

    @property
    def rows_per_record(self) -> int:
        return KINDS[self.kind]

    def check_kernel(self, objective: str, kernel: Any) -> None:
        """No rollout: any kernel (the sampler still serves evaluation)."""

    def records(self, policy) -> OfflineRecords:
        from flowrl.data.preferences import cached_latents, manifest_path, read_records

        pairs = self.kind == "pairs"
        recs = read_records(self.path, need_rejected=pairs)
        lat = cached_latents(policy, recs, Path(manifest_path(self.path)).parent)
        latents = torch.stack([lat["chosen"], lat["rejected"]], 1) if pairs else lat["chosen"][:, None]
        labels = torch.tensor([1.0, -1.0] if pairs else [1.0]).expand(len(recs), -1).clone()
        return OfflineRecords([r.prompt for r in recs], [r.meta for r in recs], latents, labels,
                              torch.tensor([r.nfe for r in recs], dtype=torch.long))

    def batches(self, rollout, adv: Tensor, generator: torch.Generator, cfg: Any) -> list:
        return self.inner.batches(rollout, adv, generator, cfg)
