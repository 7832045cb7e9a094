"""One random generator per sample, derived from (seed, iteration, prompt index, sample index).

    seed_of(seed, it, p, s) = int.from_bytes(sha256(b"flowrl|{seed}|{it}|{p}|{s}")[:8], "little") mod 2⁶³

``sample_generator`` returns a ``torch.Generator`` seeded with that value. Every random draw of a sample (its
starting noise, then the ε of each stochastic step in order) comes from its own generator, so a sample is
reproduced exactly whether it is generated alone or in any batch, on any rank (Sol-RL-style regeneration and
resume rely on this). sha256 makes nearby tuples give unrelated streams and is stable across Python versions
(unlike ``hash``).
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import Tensor


def derived_seed(*parts, namespace: str = "flowrl") -> int:
    """A 63-bit seed from a tuple: int.from_bytes(sha256("namespace|p1|p2|…")[:8], "little") mod 2⁶³. The one
    seed derivation of the project (samples, training draws, windows, Gram micro-batches)."""
    digest = hashlib.sha256("|".join(map(str, (namespace, *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "little") % (1 << 63)


def derived_generator(*parts, namespace: str = "flowrl", device: torch.device | str = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` seeded with :func:`derived_seed` of ``parts``."""
    g = torch.Generator(device=device)
    g.manual_seed(derived_seed(*parts, namespace=namespace))
    return g


def sample_seed(seed: int, iteration: int, prompt_idx: int, sample_idx: int) -> int:
    """The 63-bit seed of one sample (hash in the module docstring)."""
    for name, val in (("seed", seed), ("iteration", iteration), ("prompt_idx", prompt_idx), ("sample_idx", sample_idx)):
        if not isinstance(val, int) or isinstance(val, bool):
            raise TypeError(f"sample_seed: {name} must be an int, got {type(val).__name__}")
    return derived_seed(seed, iteration, prompt_idx, sample_idx)


def sample_generator(seed: int, iteration: int, prompt_idx: int, sample_idx: int,
                     device: torch.device | str = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` on ``device`` seeded with :func:`sample_seed`."""
    sample_seed(seed, iteration, prompt_idx, sample_idx)      # type checks
    return derived_generator(seed, iteration, prompt_idx, sample_idx, device=device)


def group_generators(seed: int, iteration: int, prompt_indices: Sequence[int], samples_per_prompt: int,
                     device: torch.device | str = "cpu") -> list[torch.Generator]:
    """Generators for a GRPO batch laid out prompt-major: rows ``p·G + j`` ↔ (prompt_indices[p], sample j)."""
    return [sample_generator(seed, iteration, int(p), j, device)
            for p in prompt_indices for j in range(samples_per_prompt)]


def randn_rows(shape: Sequence[int], generators: Sequence[torch.Generator], device=None,
               dtype: torch.dtype = torch.float32) -> Tensor:
    """(len(generators), *shape) standard normal; row b drawn from ``generators[b]`` alone."""
    if len(generators) == 0:
        raise ValueError("randn_rows needs one generator per row, got none")
    rows = [torch.randn(tuple(shape), generator=g, device=device if device is not None else g.device, dtype=dtype)
            for g in generators]
    return torch.stack(rows)
