"""Self-forcing rollout: the causal student generates chunk by chunk from its own KV-cached clean history.

Self-Forcing (arXiv 2506.08009) ``pipeline/self_forcing_training.py::inference_with_trajectory``:

    for chunk b:  x = ε_b
        for i, t_i in steps:
            i ≠ exit:  x̂0 = G(x, t_i | cache)  (no grad);  x ← re-noise(x̂0, t_{i+1})
            i = exit:  x̂0 = G(x, t_i | cache)  (with grad);  stop
        out_b = x̂0;  no-grad pass G(x̂0 noised to context_noise, t = context_noise) writes the cache

Re-noising: "sde" draws fresh ε (Self-Forcing); "ode" reuses the predicted ε̂ = x + (1−σ)·v, which makes the
step an Euler step x' = x + (σ' − σ)·v (FastVideo ``student_sample_type: ode``).
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.distill.causal_wan import CausalWan, x0_from_flow
from flowrl.distill.schedule import add_noise


def chunk_slices(num_frames: int, chunk_frames: int) -> list[slice]:
    """Frame slices of the chunks; the first chunk absorbs ``num_frames % chunk_frames`` extra frames."""
    if num_frames < chunk_frames:
        raise ValueError(f"{num_frames} latent frames is fewer than one chunk ({chunk_frames}); "
                         "generate more frames or lower chunk_frames")
    first = chunk_frames + num_frames % chunk_frames
    bounds = [0, *range(first, num_frames + 1, chunk_frames)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


def renoise(x: Tensor, v: Tensor, sigma: float, sigma_next: float, kind: str,
            generator: torch.Generator | None = None) -> Tensor:
    """Move a chunk from σ to σ_next: "sde" x' = (1−σ')x̂0 + σ'ε_fresh, "ode" x' = (1−σ')x̂0 + σ'ε̂."""
    x0 = x - sigma * v
    if kind == "sde":
        eps = torch.randn(x.shape, generator=generator).to(x)
    elif kind == "ode":
        eps = x + (1 - sigma) * v
    else:
        raise ValueError(f"re-noising must be 'sde' or 'ode', got {kind!r}")
    return (1 - sigma_next) * x0 + sigma_next * eps


@dataclass
class RolloutResult:
    """A self-forcing rollout.

    video: (B, C, F, H, W) student output; carries grad (through the exit-step forwards only) when asked.
    exit_steps: the step index at which each chunk stopped.
    replay_inputs / replay_timesteps: per chunk, the exit-step input x and its t (for replay and ODE-style use).
    """

    video: Tensor
    exit_steps: list[int]
    replay_inputs: list[Tensor] = field(default_factory=list)
    replay_timesteps: list[float] = field(default_factory=list)


def sample_exit_steps(num_chunks: int, num_steps: int, same_across_chunks: bool = True,
                      last_step_only: bool = False, generator: torch.Generator | None = None) -> list[int]:
    """Exit step per chunk: the last step, one shared random step (Self-Forcing default), or one per chunk."""
    if last_step_only:
        return [num_steps - 1] * num_chunks
    if same_across_chunks:
        return [int(torch.randint(0, num_steps, (1,), generator=generator))] * num_chunks
    return torch.randint(0, num_steps, (num_chunks,), generator=generator).tolist()


def stream_chunks(student: CausalWan, noise: Tensor, text: Tensor, timesteps: Tensor,
                  exit_steps: list[int] | None = None, renoise_kind: str = "sde", context_noise: float = 0.0,
                  grad: bool = False, generator: torch.Generator | None = None,
                  record: dict | None = None) -> Iterator[Tensor]:
    """Yield each chunk's clean latents (B, C, f, H, W) as soon as it is generated.

    ``grad``: run each chunk's exit-step forward with autograd (every other pass is no-grad). The cache is
    written by a no-grad pass after every chunk but the last; the cache never holds graph.
    """
    b, _, f, h, w = noise.shape
    slices = chunk_slices(f, student.chunk_frames)
    exits = exit_steps if exit_steps is not None else [len(timesteps) - 1] * len(slices)
    cache = student.new_cache(h, w)
    ts = [float(t) for t in timesteps]
    for k, sl in enumerate(slices):
        x = noise[:, :, sl]
        for i, t in enumerate(ts):
            last = i == exits[k]
            with torch.set_grad_enabled(grad and last):
                v = student.chunk(x, torch.full((b,), t, device=x.device), text, cache)
            if last:
                if record is not None:
                    record.setdefault("inputs", []).append(x.detach())
                    record.setdefault("timesteps", []).append(t)
                x0 = x0_from_flow(x, v, torch.tensor(t / 1000))
                break
            with torch.no_grad():
                x = renoise(x, v, t / 1000, ts[i + 1] / 1000, renoise_kind, generator)
        yield x0
        if k < len(slices) - 1:
            with torch.no_grad():
                ctx = x0.detach()
                if context_noise > 0:
                    ctx = add_noise(ctx, torch.randn(ctx.shape, generator=generator).to(ctx),
                                    torch.full((b,), context_noise / 1000))
                student.chunk(ctx, torch.full((b,), float(context_noise), device=x.device), text, cache,
                              write=True)


def self_forcing_rollout(student: CausalWan, noise: Tensor, text: Tensor, timesteps: Tensor,
                         same_exit_across_chunks: bool = True, last_step_only: bool = False,
                         renoise_kind: str = "sde", context_noise: float = 0.0, grad: bool = True,
                         generator: torch.Generator | None = None,
                         exit_generator: torch.Generator | None = None) -> RolloutResult:
    """Training rollout with a random exit step (stochastic gradient truncation, Self-Forcing §3).
    ``exit_generator`` (default ``generator``) draws the exit steps; give every rank the same one, as
    Self-Forcing broadcasts the exit step from rank 0."""
    n_chunks = len(chunk_slices(noise.shape[2], student.chunk_frames))
    exits = sample_exit_steps(n_chunks, len(timesteps), same_exit_across_chunks, last_step_only,
                              exit_generator or generator)
    rec: dict = {}
    chunks = list(stream_chunks(student, noise, text, timesteps, exits, renoise_kind, context_noise, grad,
                                generator, rec))
    return RolloutResult(torch.cat(chunks, dim=2), exits, rec.get("inputs", []), rec.get("timesteps", []))
