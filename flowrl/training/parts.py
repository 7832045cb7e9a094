"""Every built component of a run, from a ``RunConfig`` through the registries (no behaviour lives here).

``build_parts(cfg, dist)`` loads the policy (POLICIES), the reward set (REWARDS via ``rewards.RewardSet``), the
objective (OBJECTIVES) with its Config, the rollout kernel and window (KERNELS, WINDOWS), the balancer
(BALANCERS), the AdamW optimizer, the eval EMA and the prompt datasets; a sharded run's policy is FSDP-sharded
before the optimizer is built (``shard``). The stages in ``flowrl.training`` take the parts they use; the loop
never names a model, reward, sampler, balancer or objective.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from flowrl.config import RunConfig
from flowrl.config.loader import resolve_registry

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Parts:
    policy: Any
    rewards: Any                         # rewards.RewardSet
    objective: Any                       # flowrl.objectives.ObjectiveSpec
    objective_cfg: Any                   # its Config instance
    kernel: Any                          # samplers.kernel.Kernel
    window: Any                          # a samplers.windows window
    balancer: Any                        # flowrl.balancers.BalancerSpec
    optimizer: torch.optim.Optimizer
    params: list
    ema: Any                             # flowrl.policies.ema.EMA or None
    train_prompts: Any
    eval_prompts: Any
    balancer_state: dict = field(default_factory=dict)      # the balancer's own (MARBLE's α-EMA)
    objective_state: dict = field(default_factory=dict)     # the objective's own (end_iteration hooks)
    sharding: Any = None                 # flowrl.distributed.fsdp.Sharding when the run is sharded (FSDP)


def build_policy(cfg: RunConfig, device) -> Any:
    """``POLICIES[kind]`` loaded from ``policy.path`` (``from_pretrained``) or its ``tiny`` preset."""
    cls = resolve_registry("flowrl.policies:POLICIES").get(cfg.policy.kind)
    load = cfg.policy.common
    if load.tiny:
        return cls.tiny(seed=cfg.run.seed, config=cfg.policy.config, device=device)
    kwargs = {"dtype": DTYPES[load.dtype], "device": device, "config": cfg.policy.config}
    if load.path is not None:
        kwargs["path"] = load.path
    return cls.from_pretrained(**kwargs)


def build_parts(cfg: RunConfig, dist, policy=None) -> Parts:
    """Construct every part of a run (policy loading may take minutes for real checkpoints)."""
    from flowrl.balancers import get_balancer
    from flowrl.data.prompts import load_prompts
    from flowrl.objectives import get_objective
    from flowrl.policies.ema import EMA
    from rewards import RewardSet
    from samplers import KERNELS, WINDOWS

    objective = get_objective(cfg.objective.kind, cfg.objective.config)
    kernel = KERNELS.get(cfg.sampler.kernel.kind)
    objective.TRAINS_ON.check_kernel(cfg.objective.kind, kernel)
    if dist.sharded:
        from flowrl.distributed.fsdp import check_shardable

        check_shardable(cfg)                 # before the policy loads
    policy = policy if policy is not None else build_policy(cfg, dist.device)
    if cfg.policy.common.compile:
        compile_policy(policy, objective, dist)
    sharding = shard(cfg, dist, policy)
    params = list(policy.trainable_parameters())
    t = cfg.train
    optimizer = torch.optim.AdamW(params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay, eps=t.eps)
    ema = EMA(params, decay=t.ema_decay, update_interval=t.ema_every) if t.ema_decay is not None else None
    window = cfg.sampler.window.config or WINDOWS.get(cfg.sampler.window.kind)()
    return Parts(
        policy=policy, rewards=RewardSet(cfg.rewards, device=dist.device),
        objective=objective, objective_cfg=cfg.objective.config, kernel=kernel, window=window,
        balancer=get_balancer(cfg.advantage.balancer.kind), optimizer=optimizer, params=params, ema=ema,
        train_prompts=load_prompts(cfg.data.train, cfg.run.seed),
        eval_prompts=load_prompts(cfg.data.eval, cfg.run.seed), sharding=sharding,
    )


def compile_policy(policy, objective, dist) -> None:
    """``policy.compile``: ``torch.compile`` every transformer that holds a weight set, in place
    (``nn.Module.compile``), so rollouts and training forwards both run compiled. Compiled forwards are
    numerically on-policy, not bit-exact (Flow-Factory ``guidance/acceleration.md``: ~1e-5, inside GRPO's
    clip): a lossy accelerator of both stages, allowed under a ratio-based objective with a warning."""
    for module in policy.weights.modules():
        module.compile()
    if objective.ratio_based:
        dist.print(f"[flowrl] policy.compile: compiled forwards differ from eager by ~1e-5 (tests/training/"
                   f"test_throughput.py); objective {objective.name!r} takes ratios against rollout log-probs "
                   "computed by the same compiled forward (no-grad graph), so its ratios carry that drift")


def shard(cfg: RunConfig, dist, policy):
    """FSDP2 over the policy's transformers when the run is sharded (``dist.sharded``), before the optimizer and
    the EMA see the parameters (sharding replaces them); also ``dist.sharding`` (the update stage's gradient
    reductions). None otherwise."""
    if not dist.sharded:
        return None
    from flowrl.distributed.fsdp import shard_policy

    d = cfg.dist
    dist.sharding = shard_policy(policy, dist.device, dist.world, d.reshard_after_forward, cfg.run.mixed_precision,
                                 d.reduce_per_step)
    return dist.sharding
