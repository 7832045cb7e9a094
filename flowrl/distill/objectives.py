"""Generator and critic losses of each distillation method on one self-forcing rollout.

dmd        Self-Forcing DMD (``model/dmd.py``)
stream_r1  DMD × exp(β·r_final) × W_intra (Stream-R1)
rmd        stage 1: chunk-marginal DMD against a chunk teacher; stage 2: video-level DMD (RMD)
ode_init   regression onto teacher ODE trajectories (CausVid), no critic
"""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from flowrl.distill import ode_init, rmd, stream_r1
from flowrl.distill.components import decode_video
from flowrl.distill.dmd import critic_flow_loss, generator_dmd_loss
from flowrl.distill.roles import Roles, bidirectional_score
from flowrl.distill.rollout import RolloutResult


@dataclasses.dataclass
class Batch:
    """One step's conditioning: prompts, their text embeddings and the negative-prompt embeddings."""

    prompts: list[str]
    text: Tensor
    text_neg: Tensor | None


def _rmd_inputs(x: Tensor, batch: Batch, cfg) -> tuple[Tensor, Batch]:
    n = x.shape[2] // cfg.rmd.score_chunk_frames
    xs = rmd.split_chunks(x, cfg.rmd.score_chunk_frames)

    def rep(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.repeat_interleave(n, dim=0)

    return xs, Batch([p for p in batch.prompts for _ in range(n)], rep(batch.text), rep(batch.text_neg))


def generator_loss(method: str, step: int, roles: Roles, rollout: RolloutResult, batch: Batch, cfg,
                   gen: torch.Generator, extras: dict) -> tuple[Tensor, dict]:
    """The generator loss for ``method`` on a rollout whose video carries grad; returns (loss, metrics)."""
    x = rollout.video
    critic = bidirectional_score(roles.critic)
    if method == "rmd" and cfg.rmd.replay:
        x = rmd.replay_forward(roles.student, rollout, batch.text)
    if method == "rmd" and rmd.stage(step, cfg.rmd) == "chunk":
        return rmd_chunk_loss(x, roles, batch, cfg, gen)
    teacher = bidirectional_score(roles.teacher)
    weight, metrics = None, {}
    if method == "stream_r1":
        weight, metrics = stream_r1_weight(x, roles, batch, cfg.stream_r1, extras)
    loss, sc = generator_dmd_loss(x, batch.text, batch.text_neg, teacher, critic, cfg.dmd, weight, gen)
    metrics.update({"loss/generator": loss, "dmd/grad_abs": sc.grad.abs().mean()})
    if method == "rmd":
        metrics["rmd/chunk_stage"] = 0.0
    return loss, metrics


def _first_rest(xs: Tensor, cb: Batch, batch_size: int) -> tuple[tuple, tuple]:
    """Split a sample-major chunk batch into (first chunks, the rest), each as (x, Batch)."""
    n = xs.shape[0] // batch_size
    first = torch.arange(batch_size) * n
    rest = torch.tensor([i for i in range(xs.shape[0]) if i % n])

    def pick(idx: Tensor) -> tuple[Tensor, Batch]:
        return (xs[idx.to(xs.device)],
                Batch([cb.prompts[i] for i in idx.tolist()], cb.text[idx.to(cb.text.device)],
                      None if cb.text_neg is None else cb.text_neg[idx.to(cb.text_neg.device)]))

    return pick(first), pick(rest)


def rmd_chunk_loss(x: Tensor, roles: Roles, batch: Batch, cfg, gen: torch.Generator) -> tuple[Tensor, dict]:
    """RMD stage 1: every score chunk against the chunk teacher and critic; with ``first_chunk_weight`` the
    first chunk goes to the base teacher and its own critic and the two losses are combined."""
    xs, cb = _rmd_inputs(x, batch, cfg)
    dcfg = dataclasses.replace(cfg.dmd, guidance_scale=cfg.rmd.chunk_guidance_scale)
    chunk_teacher = bidirectional_score(roles.chunk_teacher or roles.teacher)
    critic = bidirectional_score(roles.critic)
    w = cfg.rmd.first_chunk_weight
    if w is None or xs.shape[0] == x.shape[0]:
        loss, sc = generator_dmd_loss(xs, cb.text, cb.text_neg, chunk_teacher, critic, dcfg, generator=gen)
        return loss, {"loss/generator": loss, "rmd/chunk_stage": 1.0, "dmd/grad_abs": sc.grad.abs().mean()}
    (x1, b1), (xr, br) = _first_rest(xs, cb, x.shape[0])
    l_first, _ = generator_dmd_loss(x1, b1.text, b1.text_neg, bidirectional_score(roles.teacher),
                                    bidirectional_score(roles.first_critic), dcfg, generator=gen)
    l_rest, sc = generator_dmd_loss(xr, br.text, br.text_neg, chunk_teacher, critic, dcfg, generator=gen)
    n_rest = xs.shape[0] // x.shape[0] - 1
    loss = rmd.combine_first_chunk(l_first, l_rest, 1, n_rest, w)
    return loss, {"loss/generator": loss, "rmd/chunk_stage": 1.0, "rmd/loss_first": l_first,
                  "rmd/loss_rest": l_rest, "dmd/grad_abs": sc.grad.abs().mean()}


def critic_loss(method: str, step: int, roles: Roles, video: Tensor, batch: Batch, cfg,
                gen: torch.Generator) -> Tensor:
    """Flow-matching loss of the critic on detached student samples (chunks in RMD stage 1; with a first-chunk
    critic, the sum of both critics' losses — their parameters are disjoint)."""
    critic = bidirectional_score(roles.critic)
    if method == "rmd" and rmd.stage(step, cfg.rmd) == "chunk":
        xs, cb = _rmd_inputs(video.detach(), batch, cfg)
        if cfg.rmd.first_chunk_weight is None or xs.shape[0] == video.shape[0]:
            return critic_flow_loss(xs, cb.text, critic, cfg.dmd, gen)
        (x1, b1), (xr, br) = _first_rest(xs, cb, video.shape[0])
        return (critic_flow_loss(xr, br.text, critic, cfg.dmd, gen)
                + critic_flow_loss(x1, b1.text, bidirectional_score(roles.first_critic), cfg.dmd, gen))
    return critic_flow_loss(video, batch.text, critic, cfg.dmd, gen)


def stream_r1_weight(x: Tensor, roles: Roles, batch: Batch, scfg: stream_r1.Config, extras: dict
                     ) -> tuple[Tensor, dict]:
    """W = exp(β·r_final)[b] · W_intra[b] for the DMD loss (detached unless ``detach_weight`` is off)."""
    fns, balance = extras["reward_fns"], extras["balance"]
    with torch.no_grad():
        pixels = decode_video(roles.vae, x.detach())
    raw, grads = stream_r1.score_axes(fns, pixels, batch.prompts, want_grad=scfg.saliency)
    r = stream_r1.normalise_axes(raw, scfg)
    r_final = balance(r)
    if not scfg.detach_weight:  # reward gradient flows into the generator through the decoder
        px = decode_video(roles.vae, x)
        from flowrl.types import RewardInput

        outs = [fn(RewardInput(px, list(batch.prompts), torch.arange(len(batch.prompts)))) for fn in fns]
        live = torch.stack([(o["score"] if isinstance(o, dict) else o).float() for o in outs], dim=1)
        live = stream_r1.normalise_axes(live, scfg)
        r_final = live.mean(dim=1) + (r_final - r.mean(dim=1)).detach()
    w_inter = stream_r1.rollout_weight(r_final, scfg.beta)
    weight = w_inter.view(-1, 1, 1, 1, 1)
    if scfg.saliency:
        sal = stream_r1.fuse_saliency(grads, r, scfg.saliency_tau, tuple(x.shape[2:]))
        w_intra = stream_r1.intra_weights(sal, scfg.temporal_strength, scfg.spatial_strength,
                                          scfg.temporal_floor, scfg.spatial_floor)
        weight = weight * w_intra
    metrics = {"stream_r1/r_final": r_final.detach().mean(), "stream_r1/w_inter": w_inter.detach().mean()}
    for d, name in enumerate(scfg.axes):
        metrics[f"stream_r1/{name}"] = r[:, d].mean()
    return weight, metrics


def ode_init_loss(roles: Roles, noise: Tensor, batch: Batch, cfg, timesteps: Tensor,
                  gen: torch.Generator) -> Tensor:
    """Teacher ODE trajectory from ``noise`` (no grad), then the student's block-wise regression loss."""
    lat, ts = ode_init.teacher_trajectory(bidirectional_score(roles.teacher), noise, batch.text, batch.text_neg,
                                          cfg.ode_init, timesteps)
    return ode_init.ode_regression_loss(roles.student, lat, ts, batch.text, gen)
