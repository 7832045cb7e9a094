"""The loss pieces the distillation methods (``flowrl.distill.methods``) are made of, on one rollout.

dmd_loss        Self-Forcing DMD ½‖x − sg(x − g)‖², optionally weighted (Self-Forcing ``model/dmd.py``)
stream_r1_weight  exp(β·r_final) × W_intra (Stream-R1, arXiv 2605.03849)
rmd_chunk_*     stage 1 of RMD: chunk-marginal DMD against a chunk teacher (``cjeen/RMD``)
ode_init_loss   regression onto teacher ODE trajectories (CausVid)
critic_loss     the critic's flow-matching loss on detached student samples
"""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from flowrl.distill import ode_init, rmd, stream_r1
from flowrl.distill.components import decode_video
from flowrl.distill.dmd import DMDConfig, critic_flow_loss, generator_dmd_loss
from flowrl.distill.roles import Roles, bidirectional_score


@dataclasses.dataclass
class Batch:
    """One step's conditioning: prompts, their text embeddings and the negative-prompt embeddings."""

    prompts: list[str]
    text: Tensor
    text_neg: Tensor | None


def _rmd_inputs(x: Tensor, batch: Batch, rcfg: rmd.Config) -> tuple[Tensor, Batch]:
    n = x.shape[2] // rcfg.score_chunk_frames
    xs = rmd.split_chunks(x, rcfg.score_chunk_frames)

    def rep(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.repeat_interleave(n, dim=0)

    return xs, Batch([p for p in batch.prompts for _ in range(n)], rep(batch.text), rep(batch.text_neg))


def dmd_loss(x: Tensor, roles: Roles, batch: Batch, dcfg: DMDConfig, gen: torch.Generator,
             weight: Tensor | None = None, metrics: dict | None = None) -> tuple[Tensor, dict]:
    """The (weighted) DMD generator loss on a video ``x`` carrying grad, teacher vs critic; (loss, metrics)."""
    critic = bidirectional_score(roles.critic)
    teacher = bidirectional_score(roles.teacher)
    loss, sc = generator_dmd_loss(x, batch.text, batch.text_neg, teacher, critic, dcfg, weight, gen)
    metrics = dict(metrics or {})
    metrics.update({"loss/generator": loss, "dmd/grad_abs": sc.grad.abs().mean()})
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


def rmd_chunk_loss(x: Tensor, roles: Roles, batch: Batch, rcfg: rmd.Config, dmd_cfg: DMDConfig,
                   gen: torch.Generator) -> tuple[Tensor, dict]:
    """RMD stage 1: every score chunk against the chunk teacher and critic; with ``first_chunk_weight`` the
    first chunk goes to the base teacher and its own critic and the two losses are combined."""
    xs, cb = _rmd_inputs(x, batch, rcfg)
    dcfg = dataclasses.replace(dmd_cfg, guidance_scale=rcfg.chunk_guidance_scale)
    chunk_teacher = bidirectional_score(roles.chunk_teacher or roles.teacher)
    critic = bidirectional_score(roles.critic)
    w = rcfg.first_chunk_weight
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


def critic_loss(video: Tensor, roles: Roles, batch: Batch, dcfg: DMDConfig, gen: torch.Generator) -> Tensor:
    """Flow-matching loss of the critic on detached student samples."""
    return critic_flow_loss(video, batch.text, bidirectional_score(roles.critic), dcfg, gen)


def rmd_chunk_critic_loss(video: Tensor, roles: Roles, batch: Batch, rcfg: rmd.Config, dcfg: DMDConfig,
                          gen: torch.Generator) -> Tensor:
    """The critic loss on RMD's score chunks (with a first-chunk critic, the sum of both critics' losses —
    their parameters are disjoint)."""
    critic = bidirectional_score(roles.critic)
    xs, cb = _rmd_inputs(video.detach(), batch, rcfg)
    if rcfg.first_chunk_weight is None or xs.shape[0] == video.shape[0]:
        return critic_flow_loss(xs, cb.text, critic, dcfg, gen)
    (x1, b1), (xr, br) = _first_rest(xs, cb, video.shape[0])
    return (critic_flow_loss(xr, br.text, critic, dcfg, gen)
            + critic_flow_loss(x1, b1.text, bidirectional_score(roles.first_critic), dcfg, gen))


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


def ode_init_loss(roles: Roles, noise: Tensor, batch: Batch, ocfg: ode_init.Config, timesteps: Tensor,
                  gen: torch.Generator) -> Tensor:
    """Teacher ODE trajectory from ``noise`` (no grad), then the student's block-wise regression loss."""
    lat, ts = ode_init.teacher_trajectory(bidirectional_score(roles.teacher), noise, batch.text, batch.text_neg,
                                          ocfg, timesteps)
    return ode_init.ode_regression_loss(roles.student, lat, ts, batch.text, gen)
