"""GARDO — Gated and Adaptive Regularization with Diversity-aware Optimization (He et al., arXiv 2512.24138;
yifan123/flow_grpo@94e23ee ``scripts/train_sd3_gardo.py``, ``flow_grpo/stat_tracking.py`` ``type='gardo'``).
Flow-GRPO with three changes, each a pure function here:

1. Gated KL. Only the most uncertain samples are regularised. With win rates w(x)_i = (#{j ≠ i: x_j < x_i} +
   ½#{j ≠ i: x_j = x_i}) / (N − 1) over the N samples of an iteration, r the trained (proxy) reward and a_1..a_K
   auxiliary rewards that are scored but not trained on (the anchor: Aesthetic and ImageReward beside OCR/GenEval),

       u_i    = mean_k w(a_k)_i − w(r)_i
       gate_i = u_i > q,  q = the (1 − f) quantile of {u_j : u_j ≥ 0}               (``uncertainty_gate``)

   The released script computes u as rank(r) − mean_k rank(a_k) with rank 1 the highest, which is (N − 1)·u here
   (tie-free; the quantile does not change). Its sign gates the samples the auxiliary rewards rate above the
   proxy; the paper's text, which was not read, may define the direction the other way. The fraction f starts at
   0.1 and adapts (``adapt_fraction``, the script's RiskCompensator): f ← 1.1·f when the mean non-negative u
   exceeds the largest of the last 20 such means, 0.9·f when below the smallest, clipped to [0.02, 0.2].
2. Adaptive reference. The KL is to a reference weight set ("ref" adapter), not the frozen base, Flow-GRPO's form
   per gated sample and averaged over the gated samples of the batch (``gated_mean``):
       KL = mean_{i: gate_i} mean_elems (μ_θ,i − μ_ref,i)² / (2 g_i²)
   and the reference is refreshed, ref ← θ, when an iteration's KL exceeded ``kl_threshold`` or ``reset_every``
   iterations after the last refresh (``should_refresh``; the script's ``kl_thres`` / ``reset_freq``).
3. Diversity-aware advantages, without the std normalisation (``diversity_advantages``). Unit-normalised image
   features φ (the anchor: DINOv3), per prompt group g:
       d_i = min_{j ≠ i, j ∈ g} (1 − φ_i·φ_j),      A_i = (r_i − mean_g r) · (d_i / mean_g d  if r_i ≥ mean_g r, else 1)
   so good samples far from their group's others are amplified; below-average ones keep their plain advantage.

The per-step loss is Flow-GRPO's clipped surrogate plus β·``gated_mean``(KL_i, gate) with μ_ref from
``grpo.reference_mean(..., adapter="ref")``.

In a run: ``objective: {kind: gardo}``, ``policy.lora.names: [train, old, ref]`` (the refreshable reference; a
fresh LoRA adapter equals the base), and at least one reward with ``weight: 0`` (scored every iteration, never
trained on: the auxiliary rewards). ``prepare_advantages`` reads the rewards, the images and its state from the
loop's ``AdvantageContext`` and hands the gate to the TrainBatches (``extras["gardo_gate"]``); ``end_iteration``
refreshes the reference from the iteration's gated KL. Image features φ here are the decoded samples
area-downsampled to at most 32×32 px (the anchor uses DINOv3 features; any feature map can replace
``image_features``). Deviation: the released script gates on ranks within the whole batch; here too, over all N
samples of the iteration (every process sees the same R and features).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from flowrl.objectives import grpo
from flowrl.objectives.sources import TRAJECTORY_ROWS
from flowrl.types import LossOut

TRAINS_ON = TRAJECTORY_ROWS
RATIO_BASED = True          # a ratio against the stored log-probs; no rollout correction: refused on lossy rollouts
REF = "ref"
GATE = "gardo_gate"


@dataclass
class Config(grpo.Config):
    """Flow-GRPO's settings (the clip, β_KL now on the gated KL to "ref") plus GARDO's gate and refresh."""

    fraction: float = 0.1          # f: initial share of non-negative-uncertainty samples regularised (RiskCompensator)
    fraction_min: float = 0.02
    fraction_max: float = 0.2
    fraction_step: float = 0.1     # α: f ← f·(1 ± α)
    history: int = 20              # iterations of mean uncertainty remembered
    kl_threshold: float = 5e-4     # refresh the reference when the gated KL exceeds this (the script's kl_thres)
    reset_every: int = 100         # … or this many iterations after the last refresh (the script's reset_freq)

    objective = "gardo"

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.fraction_min <= self.fraction <= self.fraction_max < 1:
            raise ValueError("gardo needs 0 < fraction_min <= fraction <= fraction_max < 1, got "
                             f"{self.fraction_min}, {self.fraction}, {self.fraction_max}")
        if self.reset_every < 1 or self.history < 1:
            raise ValueError(f"gardo reset_every and history must be >= 1, got {self.reset_every}, {self.history}")


def win_rates(x: Tensor) -> Tensor:
    """w_i = (#{j ≠ i: x_j < x_i} + ½·#{j ≠ i: x_j = x_i}) / (N − 1), (N,) float64; needs N ≥ 2."""
    n = x.numel()
    if n < 2:
        raise ValueError(f"win_rates needs at least 2 samples, got {n}")
    x = x.double().flatten()
    less = (x[None, :] < x[:, None]).sum(1).double()
    ties = (x[None, :] == x[:, None]).sum(1).double() - 1
    return (less + 0.5 * ties) / (n - 1)


def uncertainty(proxy: Tensor, auxiliary: Tensor) -> Tensor:
    """u_i = mean_k w(a_k)_i − w(r)_i (module docstring); proxy (N,), auxiliary (N, K)."""
    if auxiliary.dim() != 2 or auxiliary.shape[0] != proxy.shape[0] or auxiliary.shape[1] < 1:
        raise ValueError(f"uncertainty: auxiliary must be (N, K>=1) with N = {proxy.shape[0]}, "
                         f"got {tuple(auxiliary.shape)}")
    aux = torch.stack([win_rates(auxiliary[:, k]) for k in range(auxiliary.shape[1])], 1).mean(1)
    return aux - win_rates(proxy)


def uncertainty_gate(u: Tensor, fraction: float) -> Tensor:
    """gate_i = u_i > the (1 − fraction) quantile of the non-negative u (numpy's linear percentile); (N,) bool."""
    nonneg = u[u >= 0]
    if nonneg.numel() == 0:
        return torch.zeros_like(u, dtype=torch.bool)
    return u > torch.quantile(nonneg.double(), 1 - fraction).to(u.dtype)


def adapt_fraction(fraction: float, mean_u: float, history: list[float], cfg: Config) -> tuple[float, list]:
    """One RiskCompensator update: (new fraction, new history of mean non-negative uncertainties)."""
    up, down = 1 + cfg.fraction_step, 1 - cfg.fraction_step
    if history:
        if mean_u > max(history):
            fraction *= up
        elif mean_u < min(history):
            fraction *= down
    fraction = min(max(fraction, cfg.fraction_min), cfg.fraction_max)
    return fraction, (history + [mean_u])[-cfg.history:]


def nearest_neighbour_distance(features: Tensor, group_ids: Tensor) -> Tensor:
    """d_i = min over the other members j of i's group of 1 − cos(φ_i, φ_j), (N,) float64; a group of one gets 1."""
    phi = features.double().flatten(1)
    phi = phi / phi.norm(dim=1, keepdim=True).clamp(min=1e-12)
    dist = 1 - (phi @ phi.T).clamp(-1, 1)
    same = (group_ids[:, None] == group_ids[None, :]) & ~torch.eye(len(group_ids), dtype=torch.bool)
    d = torch.where(same, dist, torch.full_like(dist, float("inf"))).min(1).values
    return torch.where(torch.isfinite(d), d, torch.ones_like(d))


def diversity_advantages(rewards: Tensor, group_ids: Tensor, features: Tensor) -> Tensor:
    """A_i = (r_i − mean_g r)·(d_i / mean_g d if r_i ≥ mean_g r else 1), (N,) float64 (module docstring)."""
    r = rewards.double()
    d = nearest_neighbour_distance(features, group_ids)
    adv = torch.empty_like(r)
    for g in group_ids.unique():
        m = group_ids == g
        centred = r[m] - r[m].mean()
        scale = torch.where(centred < 0, torch.ones_like(centred), d[m] / d[m].mean().clamp(min=1e-12))
        adv[m] = centred * scale
    return adv


def should_refresh(kl: float, iterations_since: int, cfg: Config) -> bool:
    """ref ← θ when the iteration's gated KL exceeded the threshold or ``reset_every`` iterations have passed."""
    return kl > cfg.kl_threshold or iterations_since > cfg.reset_every


def gated_mean(per_sample: Tensor, gate: Tensor) -> Tensor:
    """Mean of ``per_sample`` over the gated samples (0 when none is gated)."""
    g = gate.to(per_sample.device).float()
    return (per_sample * g).sum() / g.sum().clamp(min=1.0)


# ---- the loop-facing parts ----------------------------------------------------------------------------------


def image_features(images: Tensor, size: int = 32) -> Tensor:
    """(N, D) features φ of decoded samples: area-downsampled to at most ``size`` px a side (videos: frame mean)."""
    x = images.float()
    if x.dim() == 5:
        x = x.mean(1)
    h, w = x.shape[-2:]
    if max(h, w) > size:
        x = F.adaptive_avg_pool2d(x, (max(1, h * size // max(h, w)), max(1, w * size // max(h, w))))
    return x.flatten(1)


def proxy_and_auxiliary(R: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """The trained reward r = Σ_{w_k > 0} w_k R_k (N,) and the auxiliary columns (weight 0) (N, A)."""
    w = weights.to(R.dtype)
    trained, aux = w > 0, w == 0
    if not aux.any():
        raise ValueError("gardo needs at least one reward with weight 0 (scored, not trained on) to estimate "
                         "uncertainty, e.g. rewards: {shapes: 1.0, shapes_clean: 0.0}")
    r = torch.where(torch.isfinite(R[:, trained]), R[:, trained] * w[trained], torch.zeros_like(R[:, trained]))
    r = torch.where(torch.isfinite(R[:, trained]).any(1), r.sum(1), torch.full_like(r[:, 0], float("nan")))
    return r, R[:, aux]


def prepare_advantages(adv: Tensor, group_ids: Tensor, cfg: Config | None = None, context=None) -> Tensor:
    """GARDO's diversity-aware advantages of the trained reward, and the KL gate (context.extras)."""
    cfg = cfg or Config()
    if context is None:
        raise ValueError("gardo needs the training loop's AdvantageContext (rewards, images, state)")
    r, aux = proxy_and_auxiliary(context.R, context.weights)
    ok = torch.isfinite(r) & torch.isfinite(aux).all(1)
    st = context.state
    u = torch.full_like(r, float("nan"), dtype=torch.float64)
    if int(ok.sum()) >= 2:
        u[ok] = uncertainty(r[ok], aux[ok])
    gate = uncertainty_gate(torch.nan_to_num(u, nan=-1.0), st.get("fraction", cfg.fraction))
    nonneg = u[torch.isfinite(u) & (u >= 0)]
    if nonneg.numel():
        st["fraction"], st["history"] = adapt_fraction(st.get("fraction", cfg.fraction), float(nonneg.mean()),
                                                       st.get("history", []), cfg)
    context.extras[GATE] = gate.float()
    out = torch.full_like(adv, float("nan"))
    if ok.any():
        feats = image_features(context.images())[ok.to(adv.device)]
        out[ok] = diversity_advantages(r[ok], group_ids[ok], feats).to(adv.dtype)
    return out


def _step_terms(policy, batch, j: int, how, cfg: Config, adv: Tensor) -> dict[str, Tensor]:
    """Flow-GRPO's per-sample terms of stored step j, with the KL to "ref" scaled so that its mean over the kept
    samples is its mean over the gated ones (``gated_mean``)."""
    sc = grpo.score_step(policy, batch, j, how)
    terms = grpo.policy_terms(sc, adv, cfg.clip_range)
    if cfg.beta_kl > 0:
        if GATE not in batch.extras:
            raise ValueError("gardo: TrainBatch.extras has no gate; gardo runs inside the trainer")
        gate = batch.extras[GATE].to(adv.device).float()
        keep = batch.weights().to(adv.device)
        scale = keep.sum() / (gate * keep).sum().clamp(min=1.0)
        kl = grpo.mean_kl(sc.out.mean, grpo.reference_mean(policy, batch, sc, how, adapter=REF), sc.out.std,
                          sc.sigma_next - sc.sigma, cfg.kl_form)
        terms["kl"] = kl * gate * scale
        terms["gated"] = gate
    return terms


def require_reference(policy) -> None:
    if REF not in policy.weight_sets():
        raise ValueError("gardo needs a refreshable reference adapter: set policy.lora.names: [train, old, ref]")


def loss(policy, batch, cfg: Config | None = None) -> LossOut:
    cfg = cfg or Config()
    if cfg.beta_kl > 0:
        require_reference(policy)
    return grpo.trajectory_loss(policy, batch, cfg, "gardo", _step_terms)


def end_iteration(policy, cfg: Config, state: dict, step: int, metrics: dict | None = None) -> None:
    """ref ← train when the iteration's gated KL passed ``kl_threshold`` or ``reset_every`` iterations passed."""
    require_reference(policy)
    since = state.get("since_refresh", 0) + 1
    kl = float((metrics or {}).get("loss/kl", 0.0))
    if should_refresh(kl, since, cfg):
        policy.copy_adapter("train", REF)
        state["refreshes"] = state.get("refreshes", 0) + 1
        since = 0
    state["since_refresh"] = since
