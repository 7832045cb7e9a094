"""Processes and devices: the one package that knows about ranks, collectives, mixed precision and sharding.

``processes.Dist`` wraps accelerate (or a plain single process) for the RL loop: each process's slice of the
samples, gathers, gradient averaging, barriers. ``fsdp`` shards the policy's transformers with FSDP2
(``fully_shard``) and moves full state dicts in and out of a sharded run's checkpoints.
"""
from flowrl.distributed.processes import Dist, make_accelerator

__all__ = ["Dist", "make_accelerator"]
