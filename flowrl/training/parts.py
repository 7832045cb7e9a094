"""Everything the RL loop composes, built from a ``RunConfig`` through the registries.

``build_parts(cfg, dist)`` returns a ``Parts``: the policy (POLICIES), the reward set (REWARDS, via
``rewards.RewardSet``), the objective (OBJECTIVES), the rollout kernel and window (KERNELS, WINDOWS), the balancer
(BALANCERS), the optimizer and eval EMA, the prompt datasets, and small verbs the loop calls (``sample``,
``train_batches``, ``loss``, ``evaluate``). The loop itself (``flowrl.training.trainer``) never names a model, reward,
sampler or objective.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from flowrl.config import RunConfig
from flowrl.config.loader import resolve_registry
from flowrl.types import Cond, RolloutResult, Trajectory

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def derived_seed(*parts) -> int:
    """A 63-bit seed from a tuple (sha256, stable across processes and Python versions)."""
    digest = hashlib.sha256("|".join(map(str, ("flowrl", *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "little") % (1 << 63)


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


def concat_results(results: list[RolloutResult]) -> RolloutResult:
    """Rollouts of consecutive row chunks → one RolloutResult (same schedule and plan)."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    traj = None
    if first.traj is not None:
        cat = {}
        for name in Trajectory.__dataclass_fields__:
            vals = [getattr(r.traj, name) for r in results]
            cat[name] = vals[0] if (name == "step_idx" or vals[0] is None) else torch.cat(vals)
        traj = Trajectory(**cat)
    x0 = None if first.x0_pred is None else torch.cat([r.x0_pred for r in results])
    return RolloutResult(torch.cat([r.latents for r in results]), first.sigmas, traj, x0, first.nfe)


def cat_conds(conds: list[Cond]) -> Cond:
    if len(conds) == 1:
        return conds[0]
    emb = {k: torch.cat([c.embeds[k] for c in conds]) for k in conds[0].embeds}
    unc = None if conds[0].uncond is None else {k: torch.cat([c.uncond[k] for c in conds]) for k in conds[0].uncond}
    return Cond(emb, unc, [p for c in conds for p in c.prompts])


@dataclass
class Parts:
    cfg: RunConfig
    dist: Any
    policy: Any
    rewards: Any
    objective: Any                       # flowrl.objectives.ObjectiveSpec
    kernel: Any
    window: Any
    balancer: Any                        # flowrl.balancers.BalancerSpec
    optimizer: torch.optim.Optimizer
    params: list
    ema: Any
    train_prompts: Any
    eval_prompts: Any
    balancer_state: dict = field(default_factory=dict)
    eval_rewards: dict | None = None     # built on first evaluation (flowrl.training.evaluation.eval_rewards)

    # ---------------------------------------------------------------------------------------- rollout
    @property
    def guidance(self) -> float:
        g = self.cfg.sampler.guidance
        return self.policy.default_guidance if g is None else g

    def plan(self, iteration: int):
        """Which rollout steps are SDE (stored): none for a deterministic kernel, else the window's plan."""
        if not self.kernel.stochastic:
            return None
        rng = random.Random(derived_seed(self.cfg.run.seed, iteration, "window"))
        return self.window.plan(iteration, self.cfg.sampler.steps, rng)

    def generator(self, seed: int, iteration: int, prompt_idx: int, sample_idx: int) -> torch.Generator:
        from samplers.rng import sample_generator

        return sample_generator(seed, iteration, prompt_idx, sample_idx)

    def sample(self, policy, prompts: list[str], gens: list, iteration: int) -> tuple[Cond, RolloutResult]:
        """Roll out ``prompts`` (one generator each) with the "old" weights, in chunks of micro_batch."""
        from samplers.rollout import rollout

        s, w = self.cfg.sampler, self.guidance
        plan, conds, results = self.plan(iteration), [], []
        neg = [self.cfg.data.negative_prompt] * len(prompts) if w > 1 else None
        for a in range(0, len(prompts), self.cfg.train.micro_batch):
            sl = slice(a, a + self.cfg.train.micro_batch)
            cond = policy.encode(prompts[sl], None if neg is None else neg[sl], cfg=w > 1)
            x1 = policy.noise(gens[sl], s.height, s.width, s.num_frames)
            sigmas = policy.sigmas(s.steps, x1)
            with policy.adapter("old"):
                res = rollout(lambda x, sig, cond=cond: policy.velocity(x, sig, cond, w), x1, sigmas, plan,
                              self.kernel, self.cfg.sampler.kernel.config, gens[sl])
            conds.append(cond)
            results.append(res)
        return cat_conds(conds), concat_results(results)

    def decode(self, policy, latents: Tensor) -> Tensor:
        step = self.cfg.train.micro_batch
        return torch.cat([policy.decode(latents[a:a + step]).float() for a in range(0, latents.shape[0], step)])

    # ------------------------------------------------------------------------------------- advantages
    def balance(self, R: Tensor, groups: Tensor, samples=None, iteration: int = 0) -> tuple[Tensor, dict]:
        """R (N, K) → A (N,) by the balancer (MARBLE also gets its reward-gradient Gram when it asks), clipped to
        ±advantage.clip, then the objective's ``prepare_advantages`` (AWR: per-group energies)."""
        weights = torch.tensor([spec.weight for spec in self.cfg.rewards.values()], dtype=torch.float32)
        bcfg = self.cfg.advantage.balancer.config
        extra = {}
        if self.cfg.advantage.balancer.kind == "marble" and samples is not None:
            from flowrl.balancers import marble

            if marble.needs_gram(self.balancer_state, bcfg):
                extra["gram"] = self.reward_gram(marble, R, groups, samples, iteration)
        adv, diag = self.balancer.balance(R, groups, weights, self.balancer_state, bcfg, **extra)
        if self.cfg.advantage.clip is not None:
            adv = adv.clamp(-self.cfg.advantage.clip, self.cfg.advantage.clip)
        return self.objective.prepare_advantages(adv, groups, self.cfg.objective.config), diag

    def reward_gram(self, marble, R: Tensor, groups: Tensor, samples, iteration: int) -> Tensor:
        """MARBLE's K×K Gram of per-reward loss gradients on the first micro-batch of this process (K backward
        passes through the objective at its first training σ / stored step), averaged over processes."""
        import dataclasses

        A_k = marble.reward_advantages(R, groups, self.cfg.advantage.balancer.config)[self.dist.local_slice(R.shape[0])]
        idx = torch.arange(min(self.cfg.train.micro_batch, A_k.shape[0]))
        gen = torch.Generator().manual_seed(derived_seed(self.cfg.run.seed, iteration, "gram"))
        batch = self.train_batches(samples, A_k[:, 0], idx, gen)[0]

        def loss_of(adv: Tensor, mask: Tensor) -> Tensor:
            return self.loss(self.policy, dataclasses.replace(batch, advantages=adv, mask=mask)).loss

        return marble.gradient_gram(loss_of, A_k[idx], self.params, reduce=self.dist.mean)

    # ---------------------------------------------------------------------------------------- updates
    def train_batches(self, samples, adv: Tensor, idx: Tensor, gen: torch.Generator) -> list:
        """The TrainBatches of one micro-batch: one per stored SDE step (GRPO, Flow-GRPO's per-step backward)
        or one per training σ (forward-process objectives, DiffusionNFT's per-timestep backward)."""
        from flowrl.objectives import TrainBatch

        cond = samples.cond.select(idx)
        a = adv[idx]
        res = samples.result
        if self.objective.NEEDS == "trajectory":
            traj = res.traj.select(idx)
            return [TrainBatch(cond, a, traj=traj, steps=[j], guidance=self.guidance,
                               kernel=self.cfg.sampler.kernel.kind, kernel_cfg=self.cfg.sampler.kernel.config)
                    for j in range(traj.x.shape[1])]
        x0 = res.latents[idx]
        cols = self.timestep_indices(res.sigmas.numel() - 1, idx.numel(), gen)      # (B, T)
        return [TrainBatch(cond, a, x0=x0, sigma=res.sigmas[cols[:, j]].to(x0.device), generator=gen,
                           guidance=self.guidance) for j in range(cols.shape[1])]

    def timestep_indices(self, num_steps: int, batch: int, gen: torch.Generator) -> Tensor:
        from flowrl.objectives import timesteps as ts

        t = self.cfg.train
        if t.timesteps == "permuted":
            return ts.permuted_subset(num_steps, batch, t.timestep_fraction, gen)
        if t.timesteps == "decoupled":
            return ts.decoupled(num_steps, batch, t.timestep_fraction, gen).unsqueeze(1)
        n = max(1, min(6, int(num_steps * t.timestep_fraction)))
        return ts.stratified(0, int(num_steps * t.timestep_fraction), n, gen).unsqueeze(0).expand(batch, -1)

    def loss(self, policy, batch):
        return self.objective.loss(policy, batch, self.cfg.objective.config)

    def backward(self, loss: Tensor) -> None:
        if self.dist.accelerator is not None:
            self.dist.accelerator.backward(loss)
        else:
            loss.backward()


def build_parts(cfg: RunConfig, dist, policy=None) -> Parts:
    """Construct every part of a run (policy loading may take minutes for real checkpoints)."""
    from flowrl.balancers import get_balancer
    from flowrl.objectives import get_objective
    from flowrl.policies.ema import EMA
    from flowrl.data.prompts import load_prompts
    from rewards import RewardSet
    from samplers import KERNELS

    if not cfg.rewards:
        raise ValueError("rewards: no reward configured; add e.g. `rewards: {shapes: {weight: 1.0}}`")
    policy = policy if policy is not None else build_policy(cfg, dist.device)
    objective = get_objective(cfg.objective.kind)
    kernel = KERNELS.get(cfg.sampler.kernel.kind)
    if objective.NEEDS == "trajectory" and not kernel.stochastic:
        raise ValueError(f"objective {cfg.objective.kind!r} trains on stored SDE steps but sampler.kernel is "
                         f"{cfg.sampler.kernel.kind!r}; set sampler.kernel.kind=flow_sde (or dance_sde, cps)")
    if cfg.train.gradient_checkpointing:
        policy.enable_gradient_checkpointing(True)
    params = list(policy.trainable_parameters())
    t = cfg.train
    optimizer = torch.optim.AdamW(params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay, eps=t.eps)
    ema = EMA(params, decay=t.ema_decay, update_interval=t.ema_every) if t.ema_decay is not None else None
    return Parts(
        cfg=cfg, dist=dist, policy=policy,
        rewards=RewardSet(cfg.rewards, device=dist.device),
        objective=objective, kernel=kernel, window=cfg.sampler.window.config or _default_window(cfg),
        balancer=get_balancer(cfg.advantage.balancer.kind), optimizer=optimizer, params=params, ema=ema,
        train_prompts=load_prompts(cfg.data.train, cfg.run.seed),
        eval_prompts=load_prompts(cfg.data.eval, cfg.run.seed),
    )


def _default_window(cfg: RunConfig):
    from samplers import WINDOWS

    return WINDOWS.get(cfg.sampler.window.kind)()
