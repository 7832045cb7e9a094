"""FSDP2 sharding of the policy's transformers (torch's ``fully_shard``, the engine torchtune uses) and the full
state dicts that keep a sharded run's checkpoints loadable on one process.

Sharding (``shard_policy``, ZeRO-3 in FSDP2's form): for every transformer the policy holds
(``policy.shard_units()``: the trainable one with its LoRA adapters; in full fine-tune also the frozen "old" and
base copies) each block is ``fully_shard``-ed, then the transformer itself (embeddings and output layers). Process
r of N keeps the r-th dim-0 chunk of every parameter, of its gradient and of its AdamW moments; a unit's full
weights exist only while it runs (all-gathered before its forward, freed after it when
``dist.reshard_after_forward``, gathered again for its backward). Gradients are reduce-scattered as their mean
over the N processes — the mean ``Dist.average_gradients`` takes without FSDP, which therefore does not average
again — once per optimizer step after accumulating unsharded over its passes (``dist.reduce_per_step``: the
unsharded run's arithmetic), or after every backward (only gradient chunks are ever held). With
``run.mixed_precision`` bf16 / fp16 the blocks compute in that dtype and gradients are reduced in float32
(``mixed_precision_policies``); "no" leaves every dtype as loaded. Text encoders, VAE and reward models are not
sharded (frozen, used outside the transformer).

Collectives: a forward of a sharded transformer all-gathers, and every process must join, so every process
makes the same number of transformer calls — equal rollout slices, evaluation on every process.

Checkpoints hold full tensors, exactly as on one process: ``full_tensors`` gathers a weight set
(``DTensor.full_tensor``; every process takes part, the main one keeps the CPU copy); the optimizer goes through
``torch.distributed.checkpoint.state_dict`` (``get_optimizer_state_dict`` / ``set_optimizer_state_dict`` with a
full state dict) with its parameter-name keys mapped to the index keys of ``optimizer.state_dict()``; loading cuts
each full tensor into the parameter's own chunk (``shard_like``). A full checkpoint thus restores on one
process and under FSDP. Sharded checkpoints (``flowrl.checkpoint.sharded``) skip the gathers:
``sharded_optimizer_state`` names each parameter's moments, each process's chunks as DTensors.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn

MIXED_DTYPES = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def accelerate_fsdp(accelerator) -> bool:
    """accelerate's FSDP config is active: its distributed type is FSDP, or ``accelerate launch`` with an FSDP
    config set ``ACCELERATE_USE_FSDP`` (flowrl then shards with ``fully_shard`` itself, not accelerate's wrapper)."""
    if accelerator is not None and accelerator.distributed_type.name == "FSDP":
        return True
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def mixed_precision_policies(mixed_precision: str, stored: torch.dtype):
    """FSDP ``MixedPrecisionPolicy`` s (blocks, transformer) for ``run.mixed_precision``. bf16 / fp16: a block
    gathers its weights in that dtype, casts its inputs to it and its outputs back to the ``stored`` dtype of the
    weights; the transformer's own layers (embeddings, output) keep the stored dtype and their inputs as the
    policy passes them (the timestep stays float32, as the SD3 / Wan pipelines pass it); every gradient is
    reduced in float32. "no": nothing is cast."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if mixed_precision not in MIXED_DTYPES:
        raise ValueError(f"run.mixed_precision must be one of {sorted(MIXED_DTYPES)}, got {mixed_precision!r}")
    dtype = MIXED_DTYPES[mixed_precision]
    if dtype is None:
        return MixedPrecisionPolicy(), MixedPrecisionPolicy()
    block = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32,
                                 output_dtype=None if stored == dtype else stored)
    return block, MixedPrecisionPolicy(reduce_dtype=torch.float32, cast_forward_inputs=False)


def check_shardable(cfg) -> None:
    """Refuse, before the policy loads, what a sharded run cannot do: a pool scout that declares
    ``copies_transformer`` (``flowrl.contracts.Scout``; the FP4 scout quantizes a merged deep copy of the whole
    transformer, ``flowrl.policies.export.merged_transformer``), since FSDP's sharded modules cannot be copied.
    Every other rollout (flat, trees, the x0_exit / steps / full scouts) runs sharded."""
    from flowrl.config.convert import ConfigError

    pool = cfg.sampler.pool
    if pool is not None and pool.scout.config.copies_transformer:
        raise ConfigError(f"sampler.pool.scout: the {pool.scout.kind} scout cannot run with dist.fsdp (it copies "
                          "the whole transformer, and a sharded transformer cannot be copied); use a scout that "
                          "does not (x0_exit, steps, full), or train without dist.fsdp")


@dataclass
class Sharding:
    """What ``shard_policy`` did: the trainable transformer (it holds the optimizer's parameters), the mesh, and
    whether gradients are reduce-scattered once per optimizer step (``dist.reduce_per_step``)."""

    module: nn.Module
    mesh: object
    reduce_per_step: bool = True

    def gradient_sync(self, last: bool) -> None:
        """Before a backward: reduce-scatter its gradients if it is the step's ``last`` pass or
        ``reduce_per_step`` is off; otherwise they accumulate unsharded on this process, as the unsharded run
        accumulates them before its all-reduce (the same arithmetic, bit for bit)."""
        self.module.set_requires_gradient_sync(last or not self.reduce_per_step)


def shard_policy(policy, device: torch.device, world: int, reshard_after_forward: bool = True,
                 mixed_precision: str = "no", reduce_per_step: bool = True) -> Sharding:
    """``fully_shard`` every block of every transformer of ``policy`` (``policy.shard_units()``), then the
    transformer, over a 1-D mesh of ``world`` processes. Call before an optimizer sees the parameters:
    sharding replaces them with DTensor parameters (this process's chunks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    block_mp, root_mp = mixed_precision_policies(mixed_precision, policy.dtype)
    units = policy.shard_units()
    if not units:
        raise ValueError(f"{type(policy).__name__}.shard_units() returned no transformer to shard")
    for transformer, blocks in units:
        if not blocks:
            raise ValueError(f"{type(policy).__name__}: no blocks to shard in {type(transformer).__name__} "
                             "(its shard_units() listed none; PolicyBase families name them in shard_blocks)")
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=block_mp)
        fully_shard(transformer, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=root_mp)
    return Sharding(units[0][0], mesh, reduce_per_step)


# ---------------------------------------------------------------------------------------- full tensors

def is_sharded(t: Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full_tensor(t: Tensor) -> Tensor:
    """The whole tensor of a DTensor (an all-gather: every process must call it), ``t`` itself otherwise."""
    return t.full_tensor() if is_sharded(t) else t


def full_tensors(state: dict[str, Tensor], keep: bool = True) -> dict[str, Tensor]:
    """Every tensor of ``state`` whole and on the CPU; where not ``keep`` the gathers still run (they are
    collectives) but nothing is kept, so only the writing process holds the full copy."""
    out = {}
    for k, v in state.items():
        whole = full_tensor(v)
        if keep:
            out[k] = whole.detach().cpu()
    return out


def shard_like(full: Tensor, like: Tensor) -> Tensor:
    """``full`` cut into ``like``'s layout when ``like`` is a DTensor: this process's chunk, no communication
    (every process holds the same ``full``); ``full`` unchanged otherwise."""
    if not is_sharded(like):
        return full
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full.to(like.device), like.device_mesh, like.placements, src_data_rank=None)


def shard_state(full: dict[str, Tensor], like: dict[str, Tensor]) -> dict[str, Tensor]:
    """``shard_like`` key by key; keys ``like`` lacks pass through (the loader names them)."""
    return {k: shard_like(v, like[k]) if k in like else v for k, v in full.items()}


# ------------------------------------------------------------------------------------------- optimizer

def parameter_names(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name in ``module`` of each optimizer parameter, in ``optimizer.state_dict()``'s index order."""
    names = {id(p): n for n, p in module.named_parameters()}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise ValueError(f"optimizer parameter {missing[0]} is not a parameter of {type(module).__name__}")
    return [names[id(p)] for p in params]


def optimizer_state_dict(sharding: Sharding, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's full state in ``optimizer.state_dict()``'s layout (index keys, CPU tensors) on the main
    process, {} on the others; every process must call it (``get_optimizer_state_dict`` gathers)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    named = get_optimizer_state_dict(sharding.module, optimizer, options=opts)
    if not named:
        return {}
    index = {n: i for i, n in enumerate(parameter_names(sharding.module, optimizer))}
    return {"state": {index[n]: s for n, s in named["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]]}


def load_optimizer_state_dict(sharding: Sharding, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Inverse of ``optimizer_state_dict``: a full state (as one process saves it) into the sharded optimizer;
    every process passes the same ``state`` (``set_optimizer_state_dict`` keeps each its chunks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = parameter_names(sharding.module, optimizer)
    named = {"state": {names[i]: s for i, s in state["state"].items()},
             "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(sharding.module, optimizer, named, options=StateDictOptions(full_state_dict=True))
    for group, saved in zip(optimizer.param_groups, state["param_groups"], strict=True):
        group.update({k: v for k, v in saved.items() if k != "params"})   # as saved (the helper makes tuples lists)


def sharded_optimizer_state(sharding: Sharding, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's per-parameter state keyed by parameter name, each moment this process's DTensor chunk
    (``get_optimizer_state_dict`` without gathering; a sharded checkpoint's "optimizer" group, the names stable
    across process counts). An optimizer that has not stepped gets its state made first (zero moments)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(sharding.module, optimizer)["state"]


def load_sharded_optimizer_state(sharding: Sharding, optimizer: torch.optim.Optimizer, state: dict,
                                 param_groups: list[dict]) -> None:
    """Inverse of ``sharded_optimizer_state``: ``state`` (name → chunks) and ``param_groups`` (as
    ``optimizer.state_dict()`` has them, index keys) into the sharded optimizer."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    names = parameter_names(sharding.module, optimizer)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in param_groups]
    set_optimizer_state_dict(sharding.module, optimizer, {"state": state, "param_groups": groups})
    for group, saved in zip(optimizer.param_groups, param_groups, strict=True):
        group.update({k: v for k, v in saved.items() if k != "params"})


def local_bytes(tensors) -> int:
    """Bytes this process holds for ``tensors`` (a DTensor counts its local chunk)."""
    total = 0
    for t in tensors:
        local = t.to_local() if is_sharded(t) else t
        total += local.numel() * local.element_size()
    return total
