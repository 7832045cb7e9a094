"""Closed-form flow for Gaussian data x0 ~ N(m, s²I): exact velocity and exact ODE map.

x_σ = (1−σ)x0 + σε ⇒ x_σ ~ N((1−σ)m, S²),  S² = (1−σ)²s² + σ².  With d = x − (1−σ)m,
E[x0 | x] = m + (1−σ)s²/S²·d,  E[ε | x] = σ/S²·d, so the exact velocity is
v(x, σ) = E[ε − x0 | x] = (σ − (1−σ)s²)/S²·d − m,  and the ODE maps x_σ' − (1−σ')m = S(σ')/S(σ)·d.
"""
from __future__ import annotations

import torch

M, S = 1.5, 0.5


def total_std(sigma, s=S):
    return torch.sqrt((1 - sigma) ** 2 * s**2 + sigma**2)


def exact_velocity(m=M, s=S):
    def vf(x, sigma):
        sg = sigma.view(-1, *[1] * (x.dim() - 1)).to(x)
        d = x - (1 - sg) * m
        return (sg - (1 - sg) * s**2) / ((1 - sg) ** 2 * s**2 + sg**2) * d - m
    return vf


def wrong_velocity(m=M, s=S):
    """The exact velocity with its data mean shifted by 0.3: a deliberately wrong drift."""
    return exact_velocity(m + 0.3, s)


def exact_ode(x, sigma, sigma_next, m=M, s=S):
    sigma, sigma_next = torch.tensor(float(sigma)), torch.tensor(float(sigma_next))
    return (1 - sigma_next) * m + total_std(sigma_next, s) / total_std(sigma, s) * (x - (1 - sigma) * m)
