"""σ grids identical to diffusers' FlowMatchEulerDiscreteScheduler.set_timesteps, as pure functions.

Static shift (SD3 / SD3.5, Wan):  σ ↦ shift·σ / (1 + (shift − 1)·σ)
Dynamic shift (FLUX):             σ ↦ e^μ / (e^μ + (1/σ − 1)),  μ = calculate_shift(image_seq_len) (linear rule)
Each grid has ``num_steps + 1`` entries, decreasing from σ_0 to a final 0.

Faithful quirks of diffusers (0.3x–0.42): without explicit ``sigmas`` the base grid is
``linspace(σ_max, σ_min)`` where σ_min is the *already shifted* last training σ, so the shift is applied twice
to that end point; FLUX's pipeline instead passes ``sigmas = linspace(1, 1/N, N)`` (float32) with μ.
The arithmetic dtypes follow diffusers' (float64 for the linspace path, float32 for given sigmas) so the grids
match to the last bit (``np_linspace`` reproduces numpy's linspace rounding in torch).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def np_linspace(start: float, stop: float, num: int) -> Tensor:
    """float64 ``numpy.linspace(start, stop, num)`` bit-for-bit (``arange·step + start``, last = stop)."""
    if num == 1:
        return torch.tensor([float(start)], dtype=torch.float64)
    y = torch.arange(num, dtype=torch.float64) * ((stop - start) / (num - 1)) + start
    y[-1] = stop
    return y


def shift_sigmas(sigmas, shift: float):
    """SD3 static shift ``shift·σ / (1 + (shift−1)·σ)`` (Esser et al. 2024, §5.3.2)."""
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def time_shift(sigmas, mu: float, kind: str = "exponential", power: float = 1.0):
    """Resolution-dependent shift: exponential ``e^μ/(e^μ + (1/σ−1)^p)`` or linear ``μ/(μ + (1/σ−1)^p)``."""
    if kind not in ("exponential", "linear"):
        raise ValueError(f"time_shift kind must be 'exponential' or 'linear', got {kind!r}")
    a = math.exp(mu) if kind == "exponential" else mu
    num = torch.full_like(sigmas, a)   # tensor / tensor: one rounding, as numpy does (scalar / tensor would not)
    return num / (a + (1 / sigmas - 1) ** power)


def calculate_shift(image_seq_len: int, base_seq_len: int = 256, max_seq_len: int = 4096,
                    base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """μ linear in the number of image tokens: μ(base_seq_len) = base_shift, μ(max_seq_len) = max_shift
    (FLUX; diffusers ``pipeline_flux.calculate_shift``)."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    b = base_shift - m * base_seq_len
    return image_seq_len * m + b


def flow_match_sigmas(num_steps: int, shift: float = 1.0, use_dynamic_shifting: bool = False,
                      mu: float | None = None, sigmas: Sequence[float] | None = None,
                      num_train_timesteps: int = 1000, time_shift_type: str = "exponential",
                      shift_terminal: float | None = None, device=None) -> Tensor:
    """The (num_steps + 1,) float32 σ grid of ``FlowMatchEulerDiscreteScheduler(num_train_timesteps, shift,
    use_dynamic_shifting, time_shift_type, shift_terminal).set_timesteps(num_steps, sigmas=sigmas, mu=mu)``.

    ``sigmas`` are the un-shifted custom values a pipeline passes (FLUX: ``linspace(1, 1/N, N)``, see
    :func:`flux_sigmas`). The timesteps the model sees are ``grid[:-1] · num_train_timesteps``.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if use_dynamic_shifting and mu is None:
        raise ValueError("use_dynamic_shifting needs mu; compute it with calculate_shift(image_seq_len)")
    if sigmas is None:
        n = num_train_timesteps
        last_train = torch.tensor([1.0 / n], dtype=torch.float32)   # diffusers' float32 training table end
        train_min = last_train if use_dynamic_shifting else shift_sigmas(last_train, shift)
        s = np_linspace(1.0 * n, train_min.item() * n, num_steps) / n
    else:
        if len(sigmas) != num_steps:
            raise ValueError(f"got {len(sigmas)} custom sigmas for num_steps={num_steps}; they must match")
        s = torch.as_tensor(sigmas, dtype=torch.float64).to(torch.float32)
    s = time_shift(s, mu, time_shift_type) if use_dynamic_shifting else shift_sigmas(s, shift)
    if shift_terminal:
        one_minus = 1 - s
        s = 1 - one_minus / (one_minus[-1] / (1 - shift_terminal))
    grid = s.to(dtype=torch.float32, device=device)
    return torch.cat([grid, torch.zeros(1, dtype=torch.float32, device=grid.device)])


def flux_sigmas(num_steps: int, image_seq_len: int, base_seq_len: int = 256, max_seq_len: int = 4096,
                base_shift: float = 0.5, max_shift: float = 1.15, device=None) -> Tensor:
    """FLUX pipeline grid: custom ``linspace(1, 1/N, N)`` with dynamic shift μ = calculate_shift(image_seq_len)."""
    mu = calculate_shift(image_seq_len, base_seq_len, max_seq_len, base_shift, max_shift)
    base = np_linspace(1.0, 1 / num_steps, num_steps)
    return flow_match_sigmas(num_steps, use_dynamic_shifting=True, mu=mu, sigmas=base, device=device)


def timesteps_from_sigmas(sigmas: Tensor, num_train_timesteps: int = 1000) -> Tensor:
    """The model's timestep per step, ``σ_i · num_train_timesteps`` for i < num_steps (diffusers)."""
    return sigmas[:-1] * num_train_timesteps


def check_grid(sigmas: Tensor) -> Tensor:
    """Validate a σ grid: 1-D, ≥ 2 entries, strictly decreasing, within [0, 1]. Returns it as float32."""
    s = torch.as_tensor(sigmas, dtype=torch.float32)
    if s.dim() != 1 or s.numel() < 2:
        raise ValueError(f"a σ grid must be 1-D with num_steps + 1 >= 2 entries, got shape {tuple(s.shape)}")
    if not bool((s[1:] < s[:-1]).all()):
        raise ValueError("a σ grid must be strictly decreasing (σ_0 ≈ 1 noise → σ_N = 0 data)")
    if bool((s < 0).any()) or bool((s > 1).any()):
        raise ValueError("σ values must lie in [0, 1] (x_σ = (1−σ)·x0 + σ·ε)")
    return s
