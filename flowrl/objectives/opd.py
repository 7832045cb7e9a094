"""On-policy distillation (DiffusionOPD; Flow-OPD's multi-teacher setting): the student samples its own SDE
rollouts and regresses every stored transition onto a frozen teacher's (verl-omni ``DistillKLLoss``
``diffusion_algos.py`` L1054–1095; UniRL ``unirl/algorithms/diffusionopd.py``; Flow-OPD, Fang et al.,
arXiv 2605.08063, ``CostaliyA/Flow-OPD`` ``scripts/train_sd3_opd_mix.py``).

For stored step j of a student rollout (x_j → x_{j+1}, σ_j → σ_{j+1}, the rollout's kernel and Config):
    μ_θ, s = kernel.step(x_j, v_θ(x_j, σ_j))          (the "train" weights, with gradient)
    μ_T    = kernel.step(x_j, v_T(x_j, σ_j))           (teacher T(i) of the row, frozen)
    KL_j   = mean_elems (μ_θ − μ_T)² / (2 s²)          = KL(N(μ_θ, s²) ‖ N(μ_T, s²)) per element (``kl_form: gaussian``)
    loss   = mean_j mean_i KL_j  (+ β_ref · the same KL to the frozen base, Flow-OPD's manifold anchor with the base)
``gaussian`` divides by the sampler's true transition variance s² (UniRL, exact); ``flow_grpo`` by s²/|dt| (what
verl-omni's ``2·std_dev_t²`` and Flow-OPD's code compute on the Flow-GRPO SDE: the KL × |dt|); ``unscaled`` by 1
(UniRL's default mean-shift matching). The reward is not in the loss (monitoring only, UniRL
``requires_advantages=False``); this is the direct-KL form of verl-omni / UniRL / Flow-Factory, not Flow-OPD's
PPO surrogate with −KL as the advantage.

Teachers: ``teachers`` names each one's weights — a trainer checkpoint (run or step directory: its "train" weights
in a copy of the student, so any LoRA or full fine-tune of the same model) or ``base`` (the frozen base). Several
teachers are routed per sample by the prompt's metadata ``route_by`` (default ``skill``) through ``tags``
(teacher → the tags it serves, Flow-Factory's ``applicable_datasets``): a tag served by two teachers or by none is
refused; one teacher serves every row. A micro-batch that mixes teachers is split per teacher (Flow-Factory), not
refused (UniRL). Teachers never enter the optimizer and are never saved with the student.
"""
from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from flowrl.objectives.batch import TrainBatch
from flowrl.objectives.grpo import (
    KL_FORMS,
    average_over_steps,
    clipped_advantages,
    mean_kl,
    reference_mean,
    score_step,
    stored_steps,
)
from flowrl.objectives.old_policy import OldUpdate
from flowrl.objectives.sources import TRAJECTORY_ROWS
from flowrl.types import LossOut

TRAINS_ON = TRAJECTORY_ROWS
TEACHER = "teacher"                     # the extras key: each row's teacher index (``teacher_names`` order)
BASE = "base"
TEACHERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # student policy → {name: teacher policy}


@dataclass
class Config:
    teachers: dict[str, str] = field(default_factory=dict)   # name → trainer checkpoint path, or "base"
    tags: dict[str, list[str]] = field(default_factory=dict)  # name → the route_by values it serves (several)
    route_by: str = "skill"           # the prompt-metadata key that routes a row (Flow-OPD: task / dataset)
    kl_form: Literal["gaussian", "flow_grpo", "unscaled"] = "gaussian"   # UniRL's exact transition variance
    beta_ref: float = 0.0             # KL to the frozen base (verl-omni kl_loss_coef; Flow-OPD MAR β 0.04)
    train_guidance: float | None = None   # None: the rollout's CFG (the teacher inherits the guidance)
    adv_clip_max: float = 5.0         # only masks non-finite rows (the reward is monitoring only)
    old_update: OldUpdate = "on_policy"

    def __post_init__(self):
        if self.kl_form not in KL_FORMS:
            raise ValueError(f"opd kl_form must be one of {KL_FORMS}, got {self.kl_form!r}")
        if self.beta_ref < 0:
            raise ValueError(f"opd beta_ref must be >= 0, got {self.beta_ref}")
        unknown = set(self.tags) - set(self.teachers)
        if unknown:
            raise ValueError(f"opd tags name teachers {sorted(unknown)} not in teachers {sorted(self.teachers)}")
        seen: dict[str, str] = {}
        for name, tags in self.tags.items():
            for t in tags:
                if t in seen:
                    raise ValueError(f"opd: tag {t!r} is served by two teachers ({seen[t]!r}, {name!r})")
                seen[t] = name
        if len(self.teachers) > 1 and set(self.teachers) - set(self.tags):
            raise ValueError(f"opd: with several teachers each needs its tags; none for "
                             f"{sorted(set(self.teachers) - set(self.tags))}")


def teacher_names(cfg: Config) -> list[str]:
    if not cfg.teachers:
        raise ValueError("opd needs teachers: {name: trainer checkpoint path or 'base'}")
    return sorted(cfg.teachers)


def route(meta: list[dict], cfg: Config) -> Tensor:
    """(N,) long: each row's teacher index in ``teacher_names(cfg)``; a one-line error for an unrouted tag."""
    names = teacher_names(cfg)
    if len(names) == 1:
        return torch.zeros(len(meta), dtype=torch.long)
    of = {t: names.index(n) for n, tags in cfg.tags.items() for t in tags}
    out = []
    for m in meta:
        tag = m.get(cfg.route_by)
        if tag not in of:
            raise ValueError(f"opd: no teacher serves {cfg.route_by}={tag!r}; add it to one teacher's tags "
                             f"(served: {sorted(of)})")
        out.append(of[tag])
    return torch.tensor(out, dtype=torch.long)


def prepare_advantages(adv: Tensor, group_ids: Tensor, cfg: Config | None = None, context=None) -> Tensor:
    """Advantages unchanged (monitoring only); each row's teacher as ``extras["teacher"]`` (routing by metadata)."""
    if context is not None and cfg is not None:
        context.extras[TEACHER] = route(context.meta(), cfg) if context.meta is not None else \
            torch.zeros(adv.shape[0], dtype=torch.long)
    return torch.where(torch.isfinite(adv), torch.zeros_like(adv), adv)


def load_teacher(student, path: str):
    """A frozen teacher: the base (``"base"``: the student under ``adapter(None)``), or a copy of the student
    with a trainer checkpoint's "train" weights."""
    if path == BASE:
        return None
    from flowrl.checkpoint import load_checkpoint, resolve_checkpoint

    tensors, _ = load_checkpoint(resolve_checkpoint(path), map_location="cpu")
    teacher = copy.deepcopy(student)
    teacher.load_adapter_state_dict(tensors["train"], "train")
    for p in teacher.trainable_parameters():
        p.requires_grad_(False)
    return teacher


def teachers_of(student, cfg: Config) -> dict:
    """{name: teacher policy or None (the base)}, loaded once per student (``TEACHERS``)."""
    have = TEACHERS.setdefault(student, {})
    for name, path in cfg.teachers.items():
        if name not in have:
            have[name] = load_teacher(student, path)
    return have


def teacher_means(student, batch: TrainBatch, sc, how, cfg: Config, rows: Tensor) -> Tensor:
    """μ_T of the re-scored step ``sc`` per row, each row under its teacher (split per teacher)."""
    teachers, names = teachers_of(student, cfg), teacher_names(cfg)
    mu = torch.empty_like(sc.out.mean)
    for t in rows.unique().tolist():
        idx = torch.nonzero(rows == t).flatten()
        teacher = teachers[names[t]]
        sub = step_rows(sc, idx)
        cond = batch.cond.select(idx)
        if teacher is None:
            mu[idx] = reference_mean(student, _with_cond(batch, cond), sub, how, None)
        else:
            mu[idx] = reference_mean(teacher, _with_cond(batch, cond), sub, how, "train")
    return mu.detach()


def _with_cond(batch: TrainBatch, cond) -> TrainBatch:
    import dataclasses

    return dataclasses.replace(batch, cond=cond)


def step_rows(sc, idx: Tensor):
    """Rows ``idx`` of a re-scored step (its states and σ's; the teacher recomputes the transition)."""
    from flowrl.objectives.grpo import StepScore

    return StepScore(sc.x[idx], sc.x_next[idx], sc.sigma[idx], sc.sigma_next[idx], None, sc.log_ratio[idx])


def _step_terms(policy, batch: TrainBatch, j: int, how, cfg: Config) -> dict[str, Tensor]:
    sc = score_step(policy, batch, j, how)
    rows = batch.extras.get(TEACHER, torch.zeros(len(batch), dtype=torch.long)).to(sc.x.device)
    mu_t = teacher_means(policy, batch, sc, how, cfg, rows)
    dt = sc.sigma_next - sc.sigma
    terms = {"distill_kl": mean_kl(sc.out.mean, mu_t, sc.out.std, dt, cfg.kl_form)}
    if cfg.beta_ref > 0:
        terms["kl"] = mean_kl(sc.out.mean, reference_mean(policy, batch, sc, how), sc.out.std, dt, cfg.kl_form)
    return terms


def loss(policy, batch: TrainBatch, cfg: Config | None = None) -> LossOut:
    if cfg is None:
        raise ValueError("opd: loss needs its Config (the teachers)")
    how = stored_steps(batch, "opd", cfg.train_guidance)
    _, keep = clipped_advantages(batch, cfg.adv_clip_max)
    sums = average_over_steps(how.steps, keep, lambda j: _step_terms(policy, batch, j, how, cfg))
    total = sums["distill_kl"] + (cfg.beta_ref * sums["kl"] if "kl" in sums else 0.0)
    metrics = {k: v.detach() for k, v in sums.items()}
    metrics["policy_loss"] = sums["distill_kl"].detach()
    return LossOut(total, metrics)
