"""The distillation methods, by name: each declares its capabilities and losses; the trainer reads only these.

    METHODS.get("rmd")(config) → a method object;  recipe: ``method: {kind: rmd, chunk_stage_iterations: 900}``

Capabilities read by ``flowrl.distill.trainer`` (class attributes or properties of the method object):

    trains_critic  a fake-score critic role is built and updated every step (two timescales, Self-Forcing);
                   False: no critic role or optimiser, the generator updates every step
    uses_rollout   the generator loss is on a self-forcing rollout; False: on fresh noise (ODE init)
    rollout_grad   the rollout's exit-step forward carries the generator gradient (RMD replay: its own forward)
    needs_rewards  ``setup`` loads reward plugins (Stream-R1's quality axes)
    chunk_teacher  checkpoint of an extra chunk-teacher role ("" none; RMD)
    first_critic   a separate first-chunk critic role (RMD's first-frame pair)

A method's own settings are its ``Config`` dataclass (None: it takes none); the ``method:`` section of a recipe
is built from it strictly (unknown keys name the nearest valid one).
"""
from __future__ import annotations

import torch
from torch import Tensor

from flowrl.distill import objectives, ode_init, rmd, stream_r1
from flowrl.registry import Registry


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


class DMD:
    """Self-Forcing DMD (arXiv 2506.08009, ``model/dmd.py``): generator ½‖x − sg(x − g)‖² on its rollout,
    critic flow matching."""

    Config = None
    trains_critic = True
    uses_rollout = True
    needs_rewards = False

    def __init__(self, config=None):
        self.config = config

    @property
    def rollout_grad(self) -> bool:
        return True

    @property
    def chunk_teacher(self) -> str:
        return ""

    @property
    def first_critic(self) -> bool:
        return False

    def setup(self, device) -> None:
        """Load what the method needs besides the roles (called when ``needs_rewards``)."""

    def schedule(self, step: int, lr_generator: float, lr_critic: float, ratio: int) -> tuple[float, float, int]:
        """(generator lr, critic lr, critic steps per generator step) in force at ``step``."""
        return lr_generator, lr_critic, ratio

    def generator_loss(self, step: int, roles, inputs, batch, cfg, gen: torch.Generator,
                       timesteps: Tensor) -> tuple[Tensor, dict]:
        """(loss, metrics) on ``inputs``: the rollout (``uses_rollout``) or the starting noise."""
        return objectives.dmd_loss(inputs.video, roles, batch, cfg.dmd, gen)

    def critic_loss(self, step: int, roles, video: Tensor, batch, cfg, gen: torch.Generator) -> Tensor:
        return objectives.critic_loss(video, roles, batch, cfg.dmd, gen)

    def state_dict(self) -> dict:
        """Method state a checkpoint carries (weights_only-safe values)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""


class StreamR1(DMD):
    """Stream-R1 (arXiv 2605.03849): ``L = exp(β·r_final) · mean(W_intra ⊙ ½(x − sg(x − g))²)``."""

    Config = stream_r1.Config
    needs_rewards = True

    def setup(self, device) -> None:
        c = self.config
        self.reward_fns = load_reward_fns(c.axes, c.axis_kwargs, device)
        self.balance = stream_r1.AxisBalance(len(c.axes), c.balance_window, c.balance_lambda)

    def generator_loss(self, step, roles, inputs, batch, cfg, gen, timesteps):
        x = inputs.video
        weight, metrics = objectives.stream_r1_weight(x, roles, batch, self.config,
                                                      {"reward_fns": self.reward_fns, "balance": self.balance})
        return objectives.dmd_loss(x, roles, batch, cfg.dmd, gen, weight, metrics)

    def state_dict(self) -> dict:
        return {"balance": self.balance.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.balance.load_state_dict(state["balance"])


class RMD(DMD):
    """RMD (``cjeen/RMD``): chunk-marginal DMD against a chunk teacher for ``chunk_stage_iterations``, then
    video DMD."""

    Config = rmd.Config

    @property
    def rollout_grad(self) -> bool:
        return not self.config.replay

    @property
    def chunk_teacher(self) -> str:
        return self.config.chunk_teacher

    @property
    def first_critic(self) -> bool:
        return self.config.first_chunk_weight is not None

    def schedule(self, step, lr_generator, lr_critic, ratio):
        return rmd.stage_settings(step, self.config, lr_generator, lr_critic, ratio)

    def generator_loss(self, step, roles, inputs, batch, cfg, gen, timesteps):
        x = inputs.video
        if self.config.replay:
            x = rmd.replay_forward(roles.student, inputs, batch.text)
        if rmd.stage(step, self.config) == "chunk":
            return objectives.rmd_chunk_loss(x, roles, batch, self.config, cfg.dmd, gen)
        loss, metrics = objectives.dmd_loss(x, roles, batch, cfg.dmd, gen)
        metrics["rmd/chunk_stage"] = 0.0
        return loss, metrics

    def critic_loss(self, step, roles, video, batch, cfg, gen):
        if rmd.stage(step, self.config) == "chunk":
            return objectives.rmd_chunk_critic_loss(video, roles, batch, self.config, cfg.dmd, gen)
        return objectives.critic_loss(video, roles, batch, cfg.dmd, gen)


class ODEInit(DMD):
    """ODE init (CausVid ``generate_ode_pairs.py``): block-wise regression onto teacher ODE trajectories from
    noise; no critic."""

    Config = ode_init.Config
    trains_critic = False
    uses_rollout = False

    def generator_loss(self, step, roles, inputs, batch, cfg, gen, timesteps):
        loss = objectives.ode_init_loss(roles, inputs, batch, self.config, timesteps, gen)
        return loss, {"loss/generator": loss}

    def critic_loss(self, step, roles, video, batch, cfg, gen):
        raise RuntimeError("ode_init trains no critic")


METHODS = Registry("distill method", {
    "dmd": "flowrl.distill.methods:DMD",
    "stream_r1": "flowrl.distill.methods:StreamR1",
    "rmd": "flowrl.distill.methods:RMD",
    "ode_init": "flowrl.distill.methods:ODEInit",
})
