"""Distribution Matching Distillation: real/fake scores, the normalised DMD gradient and the critic loss.

Self-Forcing ``model/dmd.py`` (arXiv 2506.08009; identical in CausVid/RMD/Stream-R1):

    x_t = (1−σ)·x + σ·ε,  x = student output (detached for scoring), t shifted and clamped to [20, 980]
    x̂_fake = critic(x_t),  x̂_real = CFG(teacher(x_t | c), teacher(x_t | c_neg))
    g = (x̂_fake − x̂_real) / mean_{C,F,H,W} |x − x̂_real|
    L_G = ½·mean( W ⊙ (x − sg(x − g))² )          ⇒  ∂L_G/∂x = W ⊙ g / N
    L_critic = mean( (v̂_critic(x_t) − (ε − x))² )   (flow-matching loss on student samples)

CFG conventions: "dmd2" x̂_c + w(x̂_c − x̂_u) (Self-Forcing w = 3) and "standard"
x̂_u + w(x̂_c − x̂_u) (diffusers/FastVideo ``dmd2.py``); the same guidance is dmd2 w = standard w − 1.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.distill.causal_wan import x0_from_flow
from flowrl.distill.schedule import add_noise, sample_score_timestep

ScoreFn = Callable[[Tensor, Tensor, Tensor], Tensor]
"""``v = score(x_t, t, text)``: a bidirectional flow prediction (teacher or critic), t on the 0..1000 scale."""

CFG_CONVENTIONS = ("dmd2", "standard")


@dataclass
class DMDConfig:
    """Self-Forcing defaults (``configs/self_forcing_dmd.yaml`` + ``default_config.yaml``)."""

    guidance_scale: float = 3.0          # real-score CFG weight
    cfg_convention: str = "dmd2"         # "dmd2": c + w(c−u) | "standard": u + w(c−u)  (dmd2 3.0 ≡ standard 4.0)
    timestep_shift: float = 5.0          # shift applied to the score timestep
    min_step: int = 20                   # 0.02·1000
    max_step: int = 980                  # 0.98·1000
    normalizer: str = "per_sample"       # "per_sample" (Self-Forcing) | "global" (FastVideo dmd2.py)

    def __post_init__(self):
        if self.cfg_convention not in CFG_CONVENTIONS:
            raise ValueError(f"cfg_convention must be one of {CFG_CONVENTIONS}, got {self.cfg_convention!r}")
        if self.normalizer not in ("per_sample", "global"):
            raise ValueError(f"normalizer must be 'per_sample' or 'global', got {self.normalizer!r}")


def cfg_combine(x_cond: Tensor, x_uncond: Tensor, scale: float, convention: str = "dmd2") -> Tensor:
    """dmd2: x_c + w·(x_c − x_u);  standard: x_u + w·(x_c − x_u)."""
    if convention == "dmd2":
        return x_cond + scale * (x_cond - x_uncond)
    if convention == "standard":
        return x_uncond + scale * (x_cond - x_uncond)
    raise ValueError(f"unknown CFG convention {convention!r}; use one of {CFG_CONVENTIONS}")


def dmd_gradient(x: Tensor, x_fake: Tensor, x_real: Tensor, normalizer: str = "per_sample") -> Tensor:
    """g = (x̂_fake − x̂_real) / mean|x − x̂_real| (DMD eq. 8), per sample or global; NaN/inf → 0."""
    diff = (x - x_real).abs()
    if normalizer == "per_sample":
        norm = diff.mean(dim=tuple(range(1, x.dim())), keepdim=True)
    else:
        norm = diff.mean()
    return torch.nan_to_num((x_fake - x_real) / norm)


def dmd_loss(x: Tensor, grad: Tensor, weight: Tensor | None = None) -> Tensor:
    """½·mean(W ⊙ (x − sg(x − g))²) in float64, so ∂L/∂x = W ⊙ g / N exactly (Self-Forcing MSE trick)."""
    xd = x.double()
    sq = (xd - (xd - grad.double()).detach()) ** 2
    if weight is not None:
        sq = sq * weight.double()
    return 0.5 * sq.mean()


@dataclass
class Scored:
    """What scoring a student sample produced (all detached)."""

    grad: Tensor
    x_real: Tensor
    x_fake: Tensor
    timestep: Tensor


def score_sample(x: Tensor, text: Tensor, text_neg: Tensor | None, teacher: ScoreFn, critic: ScoreFn,
                 cfg: DMDConfig, generator: torch.Generator | None = None) -> Scored:
    """Noise the (detached) student sample, query the real (teacher, CFG) and fake (critic) scores, and form g."""
    x = x.detach()
    t = sample_score_timestep(x.shape[0], cfg.timestep_shift, cfg.min_step, cfg.max_step, generator).to(x.device)
    sigma = t / 1000
    eps = torch.randn(x.shape, generator=generator).to(x)
    x_t = add_noise(x, eps, sigma)
    with torch.no_grad():
        x_fake = x0_from_flow(x_t, critic(x_t, t, text), sigma)
        x_cond = x0_from_flow(x_t, teacher(x_t, t, text), sigma)
        if text_neg is not None and cfg.guidance_scale != 0:
            x_uncond = x0_from_flow(x_t, teacher(x_t, t, text_neg), sigma)
            x_real = cfg_combine(x_cond, x_uncond, cfg.guidance_scale, cfg.cfg_convention)
        else:
            x_real = x_cond
    grad = dmd_gradient(x, x_fake, x_real, cfg.normalizer)
    return Scored(grad, x_real, x_fake, t)


def generator_dmd_loss(x: Tensor, text: Tensor, text_neg: Tensor | None, teacher: ScoreFn, critic: ScoreFn,
                       cfg: DMDConfig, weight: Tensor | None = None,
                       generator: torch.Generator | None = None) -> tuple[Tensor, Scored]:
    """The DMD generator loss on a student sample ``x`` (with grad), optional element weight ``W``."""
    scored = score_sample(x, text, text_neg, teacher, critic, cfg, generator)
    return dmd_loss(x, scored.grad, weight), scored


def critic_flow_loss(x: Tensor, text: Tensor, critic: ScoreFn, cfg: DMDConfig,
                     generator: torch.Generator | None = None) -> Tensor:
    """Flow-matching loss of the critic on detached student samples: mean((v̂(x_t) − (ε − x))²)."""
    x = x.detach()
    t = sample_score_timestep(x.shape[0], cfg.timestep_shift, cfg.min_step, cfg.max_step, generator).to(x.device)
    eps = torch.randn(x.shape, generator=generator).to(x)
    x_t = add_noise(x, eps, t / 1000)
    v = critic(x_t, t, text)
    return ((v.float() - (eps - x).float()) ** 2).mean()
