"""The two-timescale distillation loop on accelerate: generator every k-th step, critic every step, EMA, resume.

Self-Forcing ``trainer/distillation.py::train``: at each iteration the generator is updated
when ``step % dfake_gen_update_ratio == 0`` (default 5), then the critic once; separate AdamW optimisers
(β₁ = 0), gradient clipping at 10, EMA of the generator (0.99 from step 200). Every random draw comes from a
generator seeded by (seed, step, role, rank), so a resumed run repeats the uninterrupted one exactly.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from flowrl.checkpoint import (
    capture_rng_state,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from flowrl.distill import objectives, rmd
from flowrl.distill.config import DistillConfig
from flowrl.distill.objectives import Batch
from flowrl.distill.roles import Roles, build_roles
from flowrl.distill.rollout import self_forcing_rollout
from flowrl.distill.schedule import denoising_timesteps
from flowrl.distill.stream_r1 import AxisBalance
from flowrl.policies.ema import EMA


def load_reward_fns(axes: dict[str, str], axis_kwargs: dict[str, dict], device) -> list:
    """Reward callables by registry name (``rewards.REWARDS``), set up on ``device``; raw (grad-capable)."""
    from rewards import REWARDS
    from rewards.build import instantiate

    fns = []
    for axis, name in axes.items():
        fn = instantiate(REWARDS.get(name), dict(axis_kwargs.get(axis, {})), name)
        if callable(getattr(fn, "setup", None)):
            fn.setup(torch.device(device), torch.float32)
        fns.append(fn)
    return fns


class DistillTrainer:
    def __init__(self, cfg: DistillConfig, roles: Roles | None = None, accelerator=None):
        from accelerate import Accelerator

        self.cfg = cfg
        self.acc = accelerator or Accelerator(mixed_precision=cfg.mixed_precision, cpu=not torch.cuda.is_available())
        self.device = self.acc.device
        is_rmd = cfg.method == "rmd"
        self.roles = (roles or build_roles(cfg.model, cfg.rmd.chunk_teacher if is_rmd else "",
                                           first_critic=is_rmd and cfg.rmd.first_chunk_weight is not None)
                      ).to(self.device)
        oc = cfg.optim
        self.g_params = [p for p in self.roles.student.parameters() if p.requires_grad]
        critics = [self.roles.critic] + ([self.roles.first_critic] if self.roles.first_critic is not None else [])
        self.c_params = [p for c in critics for p in c.parameters() if p.requires_grad]
        self.opt_g = torch.optim.AdamW(self.g_params, lr=oc.lr_generator, betas=oc.betas_generator,
                                       weight_decay=oc.weight_decay)
        self.opt_c = torch.optim.AdamW(self.c_params, lr=oc.lr_critic, betas=oc.betas_critic,
                                       weight_decay=oc.weight_decay)
        self.ema = EMA(self.g_params, decay=oc.ema_decay, update_interval=1, warmup=False)
        self.timesteps = denoising_timesteps(cfg.rollout.steps)
        self.prompts = cfg.prompt_list()
        self.step = 0
        self.extras: dict = {}
        if cfg.method == "stream_r1":
            s = cfg.stream_r1
            self.extras = {"reward_fns": load_reward_fns(s.axes, s.axis_kwargs, self.device),
                           "balance": AxisBalance(len(s.axes), s.balance_window, s.balance_lambda)}
        self._neg_cache: Tensor | None = None

    # ------------------------------------------------------------------ randomness and data
    def generator(self, step: int, role: str) -> torch.Generator:
        key = f"{self.cfg.seed}/{step}/{role}/{self.acc.process_index}".encode()
        return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1)

    def shared_generator(self, step: int, role: str) -> torch.Generator:
        """Same stream on every rank (e.g. the exit step, broadcast from rank 0 in Self-Forcing)."""
        key = f"{self.cfg.seed}/{step}/{role}/shared".encode()
        return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1)

    def batch(self, step: int, role: str) -> Batch:
        b, n = self.cfg.batch_size, len(self.prompts)
        offset = (step * 2 + (role == "critic")) * b * self.acc.num_processes + self.acc.process_index * b
        prompts = [self.prompts[(offset + i) % n] for i in range(b)]
        enc = self.roles.text_encoder
        with torch.no_grad():
            text = enc(prompts).to(self.device)
            if self._neg_cache is None:
                self._neg_cache = enc([self.cfg.negative_prompt]).to(self.device)
        neg = self._neg_cache.expand(b, -1, -1) if self.cfg.dmd.guidance_scale != 0 else None
        return Batch(prompts, text, neg)

    def noise(self, gen: torch.Generator) -> Tensor:
        r = self.cfg.rollout
        shape = (self.cfg.batch_size, self.roles.student.transformer.config.in_channels, r.num_frames,
                 r.height, r.width)
        return torch.randn(shape, generator=gen).to(self.device)

    def rollout(self, step: int, role: str, grad: bool):
        r = self.cfg.rollout
        return self_forcing_rollout(
            self.roles.student, self.noise(self.generator(step, role + "/noise")), self.batch(step, role).text,
            self.timesteps, r.same_exit_across_chunks, r.last_step_only, r.renoise, r.context_noise, grad,
            self.generator(step, role + "/renoise"), self.shared_generator(step, role + "/exit"))

    # ------------------------------------------------------------------ updates
    def _apply(self, loss: Tensor, params: list, opt: torch.optim.Optimizer) -> Tensor:
        opt.zero_grad(set_to_none=True)
        self.acc.backward(loss)
        if self.acc.num_processes > 1:
            for p in params:
                if p.grad is not None:
                    p.grad = self.acc.reduce(p.grad, reduction="mean")
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.optim.max_grad_norm)
        opt.step()
        return norm

    def generator_step(self, step: int) -> dict:
        cfg, m = self.cfg, self.cfg.method
        batch = self.batch(step, "generator")
        gen = self.generator(step, "generator/score")
        if m == "ode_init":
            loss = objectives.ode_init_loss(self.roles, self.noise(self.generator(step, "generator/noise")), batch,
                                            cfg, self.timesteps, gen)
            metrics = {"loss/generator": loss}
        else:
            grad_in_rollout = not (m == "rmd" and cfg.rmd.replay)
            ro = self.rollout(step, "generator", grad_in_rollout)
            loss, metrics = objectives.generator_loss(m, step, self.roles, ro, batch, cfg, gen, self.extras)
        metrics["grad_norm/generator"] = self._apply(loss, self.g_params, self.opt_g)
        if step >= cfg.optim.ema_start_step:
            self.ema.update(step)
        else:  # Self-Forcing starts the EMA at ema_start_step from the live weights
            for s, p in zip(self.ema.shadow, self.g_params):
                s.copy_(p.detach().float())
        return metrics

    def critic_step(self, step: int) -> dict:
        with torch.no_grad():
            ro = self.rollout(step, "critic", grad=False)
        loss = objectives.critic_loss(self.cfg.method, step, self.roles, ro.video, self.batch(step, "critic"),
                                      self.cfg, self.generator(step, "critic/score"))
        return {"loss/critic": loss, "grad_norm/critic": self._apply(loss, self.c_params, self.opt_c)}

    def _schedule(self, step: int) -> int:
        """Set this step's learning rates (RMD switches them at stage 2); returns critic steps per generator."""
        oc = self.cfg.optim
        lr_g, lr_c, ratio = oc.lr_generator, oc.lr_critic, oc.critic_steps_per_generator
        if self.cfg.method == "rmd":
            lr_g, lr_c, ratio = rmd.stage_settings(step, self.cfg.rmd, lr_g, lr_c, ratio)
        for opt, lr in ((self.opt_g, lr_g), (self.opt_c, lr_c)):
            for group in opt.param_groups:
                group["lr"] = lr
        return ratio

    def train_step(self, step: int) -> dict:
        metrics: dict = {}
        ratio = self._schedule(step)
        with self.acc.autocast():
            if step % ratio == 0 or self.cfg.method == "ode_init":
                metrics.update(self.generator_step(step))
            if self.cfg.method != "ode_init":
                metrics.update(self.critic_step(step))
        return {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in metrics.items()}

    # ------------------------------------------------------------------ checkpoints
    def save(self, step: int) -> Path:
        """Atomic checkpoint: student, critic, EMA weights + optimiser/balance/RNG state."""
        ema = {f"{i}": s for i, s in enumerate(self.ema.shadow)}
        state = {"step": step, "opt_g": self.opt_g.state_dict(), "opt_c": self.opt_c.state_dict(),
                 "ema_num_updates": self.ema.num_updates, "rng": capture_rng_state()}
        if "balance" in self.extras:
            state["balance"] = self.extras["balance"].state_dict()
        tensors = {"student": self.roles.student.transformer.state_dict(),
                   "critic": self.roles.critic.transformer.state_dict(), "ema": ema}
        if self.roles.first_critic is not None:
            tensors["first_critic"] = self.roles.first_critic.transformer.state_dict()
        return save_checkpoint(self.cfg.output_dir, step, tensors, state, keep_last=self.cfg.keep_last)

    def resume(self, path: str | Path | None = None) -> int:
        """Load the latest (or given) checkpoint; returns the step to continue from (0 when none)."""
        p = path or latest_checkpoint(self.cfg.output_dir)
        if p is None:
            return 0
        tensors, state = load_checkpoint(p, map_location=self.device)
        self.roles.student.transformer.load_state_dict(tensors["student"])
        self.roles.critic.transformer.load_state_dict(tensors["critic"])
        if self.roles.first_critic is not None:
            self.roles.first_critic.transformer.load_state_dict(tensors["first_critic"])
        for i, s in enumerate(self.ema.shadow):
            s.copy_(tensors["ema"][str(i)])
        self.ema.num_updates = int(state["ema_num_updates"])
        self.opt_g.load_state_dict(state["opt_g"])
        self.opt_c.load_state_dict(state["opt_c"])
        if "balance" in state:
            self.extras["balance"].load_state_dict(state["balance"])
        restore_rng_state(state["rng"])
        self.step = int(state["step"]) + 1
        return self.step

    def fit(self, iterations: int | None = None, logger=None) -> list[dict]:
        """Run from ``self.step`` to ``iterations`` (default cfg.iterations); checkpoints every save_every."""
        end = self.cfg.iterations if iterations is None else iterations
        history = []
        for step in range(self.step, end):
            metrics = self.train_step(step)
            history.append(metrics)
            if logger is not None and step % self.cfg.log_every == 0:
                logger.log(metrics, step)
            if self.acc.is_main_process and ((step + 1) % self.cfg.save_every == 0 or step == end - 1):
                self.save(step)
            self.step = step + 1
        return history

    @contextmanager
    def ema_student(self):
        """The student with the EMA weights swapped in (live weights restored on exit)."""
        self.ema.store()
        self.ema.copy_to()
        try:
            yield self.roles.student
        finally:
            self.ema.restore()
