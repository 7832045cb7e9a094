"""Activation estimate: a measured probe on the family's tiny model, scaled by rows × tokens × width (× blocks).

Probe (CPU, float32, ``counter.peak_allocated``): the tiny preset's transformer rebuilt with 1 and 2 blocks
(FLUX: 1 and 2 of each block kind), the run's LoRA targets at rank r·D₀/D (so the adapter's share of the width is
the run's), ``B₀ = 2`` rows at the probe geometry, no CFG. Peak bytes above entry of one velocity call, then

    k_block = (a₂ − a₁) / (B₀·T₀·D₀·4),   k_rest = a₁ / (B₀·T₀·D₀·4) − k_block

for a training forward + backward without and with gradient checkpointing, and k_fwd (no grad, 2 blocks) for
a rollout forward. Scaled to the run (the law assumed, an estimate):

    train  = rows · T · D · e · (L·k_block + k_rest)      rollout = rows · T · D · e · k_fwd

with T tokens (image + text), D the width, L blocks (FLUX: pairs), e the compute dtype's bytes. It assumes the
attention stores no T×T matrix (flash / memory-efficient SDPA, also what CPU SDPA picks) and that the probe's
MLP ratio and per-token layout are the model's; it is checked only at the toy and tiny scales (docs/memory.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

PROBE = {"toy": (32, 32, None), "sd3": (32, 32, None), "flux": (32, 32, None), "wan": (64, 64, 9)}
PROBE_ROWS = 2
PROBE_TEXT = 64              # max_sequence_length of the probe's text encoders (SD3 / FLUX / Wan)


@dataclass(frozen=True)
class Coefficients:
    """Bytes per (row · token · width · element byte), measured on a probe."""

    block: float                 # per block, training forward + backward
    rest: float                  # the remainder of the transformer (embeddings, output, loss) + backward temporaries
    block_ckpt: float            # per block with gradient checkpointing (the block's saved inputs)
    rest_ckpt: float             # the rest with checkpointing (incl. one block recomputed in backward)
    forward: float               # one forward without grad (the rollout's transient)
    probe: dict                  # what was measured (bytes, geometry)

    def train(self, units: float, checkpointing: bool) -> float:
        return units * (self.block_ckpt if checkpointing else self.block) + (
            self.rest_ckpt if checkpointing else self.rest)


def probe_policy(family: str, blocks: int, rank: int | None, checkpointing: bool):
    """The family's tiny policy with ``blocks`` blocks (of each kind), LoRA rank ``rank`` (None: full weights)."""
    from flowrl.planning.models import tiny_transformer
    from flowrl.policies import POLICIES, tiny, toy_modules
    from flowrl.policies.lora import LoraConfig

    cls = POLICIES.get(family)
    base = cls.config_class()
    lora = None if rank is None else LoraConfig(rank=rank, alpha=2 * rank, target_modules=base.lora.target_modules)
    extra = {"max_sequence_length": PROBE_TEXT} if hasattr(base, "max_sequence_length") else {}
    config = cls.config_class(lora=lora, gradient_checkpointing=checkpointing, **extra)
    layers = {"num_layers": blocks, **({"num_single_layers": blocks} if family == "flux" else {})}
    transformer = tiny_transformer(family, **layers)
    if family == "toy":
        tok, te, _ = toy_modules.build_modules("tiny")
        return cls(tok, te, transformer, config)
    comps = {"sd3": tiny.sd3_components, "flux": tiny.flux_components, "wan": tiny.wan_components}[family]()
    return cls({**comps, "transformer": transformer}, config, "cpu", torch.float32)


def probe_bytes(policy, family: str, grad: bool) -> int:
    """Peak bytes above entry of one velocity call (+ backward of a mean-square loss when ``grad``)."""
    from flowrl.planning.counter import peak_allocated

    h, w, f = PROBE[family]
    cond = policy.encode(["a red circle left of a blue square"] * PROBE_ROWS, cfg=False)
    x = policy.noise([torch.Generator().manual_seed(i) for i in range(PROBE_ROWS)], h, w, f)
    sigma = torch.full((PROBE_ROWS,), 0.5)
    full = not policy.weights.is_lora
    if full:
        for m in policy.weights.modules():
            m.requires_grad_(False)             # weight gradients are the budget's own item, not activations

    def call():
        with torch.set_grad_enabled(grad):
            xi = x.clone().requires_grad_(grad and full)
            v = policy.velocity(xi, sigma, cond, 1.0)
            if grad:
                v.square().mean().backward()

    return peak_allocated(call)[1]


@lru_cache(maxsize=None)
def coefficients(family: str, rank: int | None) -> Coefficients:
    """Measure the probe of ``family`` (LoRA rank ``rank`` at the probe width, None: full fine-tune)."""
    from flowrl.planning.geometry import geometry
    from flowrl.planning.models import transformer_config

    torch.manual_seed(0)
    tcfg = transformer_config(family, None, True)
    g = geometry(family, tcfg, True, *PROBE[family], 16 if family == "toy" else PROBE_TEXT)
    unit = PROBE_ROWS * g.tokens * g.width * 4
    a = {(n, ck): probe_bytes(probe_policy(family, n, rank, ck), family, True) for n in (1, 2) for ck in (False, True)}
    fwd = probe_bytes(probe_policy(family, 2, rank, False), family, False)
    block, block_ck = (a[2, False] - a[1, False]) / unit, (a[2, True] - a[1, True]) / unit
    return Coefficients(block=block, rest=a[1, False] / unit - block, block_ckpt=block_ck,
                        rest_ckpt=a[1, True] / unit - block_ck, forward=fwd / unit,
                        probe={"bytes": {f"{n}_blocks{'_ckpt' if ck else ''}": v for (n, ck), v in a.items()},
                               "forward_bytes": fwd, "rows": PROBE_ROWS, "tokens": g.tokens, "width": g.width})


def probe_rank(rank: int, width: int, family: str) -> int:
    """The probe's LoRA rank: r·D₀/D (at least 1), D₀ the probe's width."""
    from flowrl.planning.models import transformer_config

    t = transformer_config(family, None, True)
    return max(1, round(rank * t["num_attention_heads"] * t["attention_head_dim"] / width))
