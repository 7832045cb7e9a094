"""The two-timescale distillation loop on accelerate: generator every k-th step, critic every step, EMA, resume.

Self-Forcing ``trainer/distillation.py::train``: at each iteration the generator is updated
when ``step % dfake_gen_update_ratio == 0`` (default 5), then the critic once; separate AdamW optimisers
(β₁ = 0), gradient clipping at 10, EMA of the generator (0.99 from step 200). Every random draw comes from the
project's one derivation ``samplers.rng.derived_generator(run.seed, step, role, rank)`` (namespace
``flowrl.distill``), so a resumed run repeats the uninterrupted one exactly.
"""
from __future__ import annotations

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
from flowrl.config import ConfigError
from flowrl.distill.config import DistillConfig, prompt_list
from flowrl.distill.methods import METHODS
from flowrl.distill.objectives import Batch
from flowrl.distill.roles import Roles, build_roles
from flowrl.distill.rollout import self_forcing_rollout
from flowrl.distill.schedule import denoising_timesteps
from flowrl.policies.ema import EMA
from samplers.rng import derived_generator

NAMESPACE = "flowrl.distill"   # of every draw's seed: samplers.rng.derived_seed(seed, step, role, rank)


class _Processes:
    """accelerate's process facts under the names ``flowrl.checkpoint.resume.prepare_fresh_run`` reads."""

    def __init__(self, acc):
        self.is_main, self.print, self.barrier = acc.is_main_process, acc.print, acc.wait_for_everyone


class DistillTrainer:
    """The distillation loop for ``cfg``; what it builds and updates follows ``self.method``'s capabilities."""

    def __init__(self, cfg: DistillConfig, roles: Roles | None = None, accelerator=None):
        from accelerate import Accelerator

        self.cfg = cfg
        rc = cfg.run
        if cfg.checkpoint.async_save:
            raise ConfigError("checkpoint.async_save: distillation saves its checkpoints synchronously (one "
                              "process writes them); set checkpoint.async_save=false")
        if rc.threads is not None:
            torch.set_num_threads(rc.threads)
        self.acc = accelerator or Accelerator(mixed_precision=rc.mixed_precision,
                                              cpu=rc.cpu or not torch.cuda.is_available())
        self.device = self.acc.device
        self.method = m = METHODS.get(cfg.method.kind)(cfg.method.config)
        self.roles = (roles or build_roles(cfg.model, m.chunk_teacher, first_critic=m.first_critic,
                                           critic=m.trains_critic)).to(self.device)
        tc = cfg.train
        self.g_params = [p for p in self.roles.student.parameters() if p.requires_grad]
        critics = [c for c in (self.roles.critic, self.roles.first_critic) if c is not None]
        self.c_params = [p for c in critics for p in c.parameters() if p.requires_grad]
        self.opt_g = torch.optim.AdamW(self.g_params, lr=tc.lr_generator, betas=tc.betas_generator,
                                       weight_decay=tc.weight_decay)
        self.opt_c = torch.optim.AdamW(self.c_params, lr=tc.lr_critic, betas=tc.betas_critic,
                                       weight_decay=tc.weight_decay) if m.trains_critic else None
        self.ema = EMA(self.g_params, decay=tc.ema_decay, update_interval=1, warmup=False)
        self.timesteps = denoising_timesteps(cfg.rollout.steps)
        self.prompts = prompt_list(cfg.data.train)
        self.step = 0
        if m.needs_rewards:
            m.setup(self.device)
        self._neg_cache: Tensor | None = None

    # ------------------------------------------------------------------ randomness and data
    def generator(self, step: int, role: str) -> torch.Generator:
        """This rank's stream for (step, role): ``derived_generator(seed, step, role, rank)``."""
        return derived_generator(self.cfg.run.seed, step, role, self.acc.process_index, namespace=NAMESPACE)

    def shared_generator(self, step: int, role: str) -> torch.Generator:
        """Same stream on every rank (e.g. the exit step, broadcast from rank 0 in Self-Forcing)."""
        return derived_generator(self.cfg.run.seed, step, role, "shared", namespace=NAMESPACE)

    def batch(self, step: int, role: str) -> Batch:
        b, n = self.cfg.train.batch_size, len(self.prompts)
        offset = (step * 2 + (role == "critic")) * b * self.acc.num_processes + self.acc.process_index * b
        prompts = [self.prompts[(offset + i) % n] for i in range(b)]
        enc = self.roles.text_encoder
        with torch.no_grad():
            text = enc(prompts).to(self.device)
            if self._neg_cache is None:
                self._neg_cache = enc([self.cfg.data.negative_prompt]).to(self.device)
        neg = self._neg_cache.expand(b, -1, -1) if self.cfg.dmd.guidance_scale != 0 else None
        return Batch(prompts, text, neg)

    def noise(self, gen: torch.Generator) -> Tensor:
        r = self.cfg.rollout
        shape = (self.cfg.train.batch_size, self.roles.student.transformer.config.in_channels, r.num_frames,
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
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.train.max_grad_norm)
        opt.step()
        return norm

    def generator_step(self, step: int) -> dict:
        cfg, m = self.cfg, self.method
        batch = self.batch(step, "generator")
        gen = self.generator(step, "generator/score")
        if m.uses_rollout:
            inputs = self.rollout(step, "generator", m.rollout_grad)
        else:
            inputs = self.noise(self.generator(step, "generator/noise"))
        loss, metrics = m.generator_loss(step, self.roles, inputs, batch, cfg, gen, self.timesteps)
        metrics["grad_norm/generator"] = self._apply(loss, self.g_params, self.opt_g)
        if step >= cfg.train.ema_start_step:
            self.ema.update(step)
        else:  # Self-Forcing starts the EMA at ema_start_step from the live weights
            for s, p in zip(self.ema.shadow, self.g_params):
                s.copy_(p.detach().float())
        return metrics

    def critic_step(self, step: int) -> dict:
        with torch.no_grad():
            ro = self.rollout(step, "critic", grad=False)
        loss = self.method.critic_loss(step, self.roles, ro.video, self.batch(step, "critic"), self.cfg,
                                       self.generator(step, "critic/score"))
        return {"loss/critic": loss, "grad_norm/critic": self._apply(loss, self.c_params, self.opt_c)}

    def _schedule(self, step: int) -> int:
        """Set this step's learning rates (the method's schedule, e.g. RMD's stage 2); returns critic steps per
        generator step."""
        tc = self.cfg.train
        lr_g, lr_c, ratio = self.method.schedule(step, tc.lr_generator, tc.lr_critic, tc.critic_steps_per_generator)
        for opt, lr in ((self.opt_g, lr_g), (self.opt_c, lr_c)):
            for group in opt.param_groups if opt is not None else ():
                group["lr"] = lr
        return ratio

    def train_step(self, step: int) -> dict:
        """Generator every ``ratio``-th step (every step without a critic), then the critic (if any)."""
        metrics: dict = {}
        ratio = self._schedule(step)
        trains_critic = self.method.trains_critic
        with self.acc.autocast():
            if not trains_critic or step % ratio == 0:
                metrics.update(self.generator_step(step))
            if trains_critic:
                metrics.update(self.critic_step(step))
        return {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in metrics.items()}

    # ------------------------------------------------------------------ checkpoints
    def _trained(self) -> dict:
        """Trainable role name → its CausalWan (the critics only where the method has them)."""
        r = self.roles
        return {k: v for k, v in (("student", r.student), ("critic", r.critic), ("first_critic", r.first_critic))
                if v is not None}

    def save(self, step: int) -> Path:
        """Atomic checkpoint: student, critic(s), EMA weights + optimiser/method/RNG state."""
        ema = {f"{i}": s for i, s in enumerate(self.ema.shadow)}
        state = {"step": step, "opt_g": self.opt_g.state_dict(), "ema_num_updates": self.ema.num_updates,
                 "method": self.method.state_dict(), "rng": capture_rng_state()}
        if self.opt_c is not None:
            state["opt_c"] = self.opt_c.state_dict()
        tensors = {k: m.transformer.state_dict() for k, m in self._trained().items()}
        tensors["ema"] = ema
        return save_checkpoint(self.cfg.run_dir, step, tensors, state, keep_last=self.cfg.checkpoint.keep)

    def resume(self, path: str | Path | None = None) -> int:
        """Load the latest (or given) checkpoint; returns the step to continue from (0 when none)."""
        p = path or latest_checkpoint(self.cfg.run_dir)
        if p is None:
            return 0
        tensors, state = load_checkpoint(p, map_location=self.device)
        for k, m in self._trained().items():
            m.transformer.load_state_dict(tensors[k])
        for i, s in enumerate(self.ema.shadow):
            s.copy_(tensors["ema"][str(i)])
        self.ema.num_updates = int(state["ema_num_updates"])
        self.opt_g.load_state_dict(state["opt_g"])
        if self.opt_c is not None:
            self.opt_c.load_state_dict(state["opt_c"])
        self.method.load_state_dict(state["method"])
        restore_rng_state(state["rng"])
        self.step = int(state["step"]) + 1
        return self.step

    def open_run_dir(self) -> int:
        """The run section's rule (as in the RL trainer): ``run.resume`` continues from the newest checkpoint
        (step 0 when there is none); otherwise a run dir holding checkpoints is refused unless ``run.restart``,
        which deletes them. Returns the step to start from."""
        from flowrl.checkpoint.resume import prepare_fresh_run

        if self.cfg.run.resume:
            return self.resume()
        prepare_fresh_run(self.cfg.run_dir, self.cfg.run.restart, _Processes(self.acc))
        return 0

    def logger(self, resume_step: int | None = None):
        """``metrics.jsonl`` (+ TensorBoard, wandb per the ``log`` section) in the run dir."""
        from flowrl.config.loader import to_dict
        from flowrl.training.metrics_log import MetricsLogger

        lc = self.cfg.log
        return MetricsLogger(self.cfg.run_dir, self.acc.is_main_process, tensorboard=lc.tensorboard,
                             wandb=lc.wandb, wandb_project=lc.project, run_name=self.cfg.run.name,
                             config=to_dict(self.cfg), resume_step=resume_step)

    def fit(self, iterations: int | None = None, logger=None) -> list[dict]:
        """Run from ``self.step`` to ``iterations`` (default train.iterations); a checkpoint every
        ``checkpoint.every`` steps (0: only at the end) and at the end."""
        from tqdm.auto import tqdm

        end = self.cfg.train.iterations if iterations is None else iterations
        every, log_every = self.cfg.checkpoint.every, self.cfg.log.every
        history = []
        bar = range(self.step, end)
        if self.cfg.log.progress and self.acc.is_main_process:
            bar = tqdm(bar, desc="distill", initial=self.step, total=end)
        for step in bar:
            metrics = self.train_step(step)
            history.append(metrics)
            if logger is not None and step % log_every == 0:
                logger.log(metrics, step)
            if self.acc.is_main_process and ((every and (step + 1) % every == 0) or step == end - 1):
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
