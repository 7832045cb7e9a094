"""Checks of a run's config, in three places, each before any model loads:

- ``check_range``: one value against its allowed range, one line naming the key (the sections'
  ``__post_init__``; the loader blames the override that set the key);
- ``validate_run(cfg, source)``: settings that depend on each other through the registries (the objective's
  sample source against the rollout kernel, held-out monitor names, the balancer's statistics), called by
  ``load_config``;
- ``check_startable(cfg)``: what a run needs to start (at least one reward, a resolution the policy family can
  generate, the prompt files, a local policy path), called by the trainer before it builds anything — the
  bare defaults (``load_config(None)``, a toy policy at 512²) stay loadable, and a resolved config can be
  printed where its files are absent.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from flowrl.config.convert import ConfigError, Source, config_error

SEED_MAX = 2**32 - 1            # numpy's global seed range (the trainer seeds python, numpy and torch with it)


def range_text(gt: float | None = None, ge: float | None = None, lt: float | None = None,
               le: float | None = None) -> str:
    """"> 0", "≥ 1", "in [0, 1)" for the given bounds."""
    def num(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    lo = (f"({num(gt)}" if gt is not None else f"[{num(ge)}") if (gt is not None or ge is not None) else None
    hi = (f"{num(lt)})" if lt is not None else f"{num(le)}]") if (lt is not None or le is not None) else None
    if lo and hi:
        return f"in {lo}, {hi}"
    if lo:
        return f"> {num(gt)}" if gt is not None else f"≥ {num(ge)}"
    return f"< {num(lt)}" if lt is not None else f"≤ {num(le)}"


def check_range(key: str, value: Any, *, gt: float | None = None, ge: float | None = None,
                lt: float | None = None, le: float | None = None, optional: str | None = None) -> None:
    """Raise ``ValueError("<key> must be <range>, got <value>")`` unless ``value`` is a number in the range.
    ``optional``: None is allowed and means this (named in the message, e.g. "null: off")."""
    if value is None and optional is not None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if ok:
        ok = ((gt is None or value > gt) and (ge is None or value >= ge)
              and (lt is None or value < lt) and (le is None or value <= le))
    if not ok:
        note = f" or null ({optional})" if optional else ""
        raise ValueError(f"{key} must be {range_text(gt, ge, lt, le)}{note}, got {value!r}")


# ------------------------------------------------------------------------------------- across sections

def validate_run(cfg, source: Source | None = None) -> None:
    """Cross-section checks through the registries (module docstring); raises ConfigError naming the key."""
    objective_fits_kernel(cfg, source)
    accelerator_fits_objective(cfg, source)
    held_out_rewards_exist(cfg, source)
    balancer_statistics_valid(cfg, source)


def objective_fits_kernel(cfg, source: Source | None) -> None:
    """The objective's sample source accepts the rollout kernel (GRPO needs a stochastic one)."""
    from flowrl.objectives import get_objective
    from samplers import KERNELS

    try:
        spec = get_objective(cfg.objective.kind, cfg.objective.config)
    except TypeError as e:                      # a plugin objective without Config / TRAINS_ON
        raise config_error(str(e), "objective.kind", source) from None
    try:
        spec.TRAINS_ON.check_kernel(cfg.objective.kind, KERNELS.get(cfg.sampler.kernel.kind))
    except ValueError as e:
        raise config_error(str(e), "sampler.kernel.kind", source) from None
    if cfg.train.async_rewards and spec.TRAINS_ON.offline:
        raise config_error(f"train.async_rewards scores rollouts, but objective {cfg.objective.kind!r} trains on "
                           "its dataset without rewards: set train.async_rewards=false", "train.async_rewards", source)


def accelerator_fits_objective(cfg, source: Source | None) -> None:
    """Flow-Factory's validator rule with verl's rollout correction (docs/training.md "Throughput"): a lossy
    ``sampler.accelerate`` under a ratio-based objective needs an objective that applies the correction and
    ``sampler.correction`` set, unless its stored transitions are the exact policy's (``stores_exact_steps``);
    the correction is refused where it would do nothing."""
    from flowrl.accelerators import build
    from flowrl.objectives import get_objective

    s, kind = cfg.sampler, cfg.objective.kind
    acc, spec = s.accelerate.kind, get_objective(kind, cfg.objective.config)
    acc_obj = build(s.accelerate)
    lossy = acc_obj.lossy
    off_policy = lossy and not acc_obj.stores_exact_steps     # the stored transitions are not π_old's
    if lossy and (s.tree is not None or s.pool is not None):
        raise config_error(f"the {acc} rollout accelerator applies to flat rollouts; drop sampler.tree / "
                           "sampler.pool or set sampler.accelerate.kind=exact", "sampler.accelerate", source)
    if off_policy and spec.ratio_based and not spec.corrects_rollouts:
        raise config_error(f"objective {kind!r} takes a ratio against the rollout's log-probs and applies no "
                           f"rollout correction: the lossy {acc} rollout accelerator would make it off-policy; "
                           "set sampler.accelerate.kind=exact", "sampler.accelerate", source)
    if off_policy and spec.ratio_based and s.correction is None:
        raise config_error(f"objective {kind!r} is ratio-based and the {acc} rollout accelerator is lossy: set "
                           "sampler.correction (e.g. {is_threshold: 2.0}) or sampler.accelerate.kind=exact",
                           "sampler.accelerate", source)
    if s.correction is not None and not (off_policy and spec.ratio_based):
        why = (f"objective {kind!r} takes no ratio against the rollout's log-probs" if off_policy else
               f"sampler.accelerate.kind={acc} is lossless" if not lossy else
               f"sampler.accelerate.kind={acc} stores the exact policy's transitions")
        raise config_error(f"sampler.correction corrects a lossy rollout under a ratio-based objective, but {why}; "
                           "set sampler.correction=null", "sampler.correction", source)


def resolution_fits_policy(cfg, source: Source | None = None) -> None:
    """The policy family's ``check_resolution`` classmethod (no weights loaded), when the family has one."""
    from flowrl.config.loader import resolve_registry

    cls = resolve_registry("flowrl.policies:POLICIES").get(cfg.policy.kind)
    check = getattr(cls, "check_resolution", None)
    if check is None:
        return
    s, load = cfg.sampler, cfg.policy.common
    try:
        check(s.height, s.width, s.num_frames, tiny=load.tiny, path=load.path)
    except ValueError as e:
        key = next((k for k in ("height", "width", "num_frames") if re.match(rf"(sampler\.)?{k}\b", str(e))),
                   "height")
        msg = re.sub(rf"^(sampler\.)?{key}:?\s*", "", str(e)) + f" (policy {cfg.policy.kind}" + \
            (", tiny)" if load.tiny else ")")
        raise (config_error(msg, f"sampler.{key}", source) if source else ConfigError(f"sampler.{key}: {msg}")) \
            from None


def balancer_statistics_valid(cfg, source: Source | None) -> None:
    """The shared fields of the balancers' group statistics, whichever balancer: ``eps`` (added to a std: > 0;
    0 divides a constant group by 0, < 0 flips signs) and ``std`` (group | global | none)."""
    from typing import get_args

    from flowrl.balancers.advantages import StdMode

    bcfg = cfg.advantage.balancer.config
    eps, std = getattr(bcfg, "eps", None), getattr(bcfg, "std", None)
    if eps is not None and not (isinstance(eps, (int, float)) and eps > 0):
        raise config_error(f"must be > 0 (it is added to the std), got {eps!r}", "advantage.balancer.eps", source)
    if std is not None and std not in get_args(StdMode):
        raise config_error(f"expected one of {list(get_args(StdMode))}, got {std!r}", "advantage.balancer.std",
                           source)


def held_out_rewards_exist(cfg, source: Source | None) -> None:
    """Every ``eval.held_out`` monitor resolves (a registry name, entry point, ``module:attr`` or file)."""
    from rewards import REWARDS

    for i, name in enumerate(cfg.eval.held_out):
        if name in cfg.rewards:
            continue
        try:
            REWARDS.get(name)
        except (KeyError, ImportError, AttributeError) as e:
            raise config_error(str(e).strip("'\""), f"eval.held_out[{i}]", source) from None


# ---------------------------------------------------------------------------------------- startable

def check_startable(cfg) -> None:
    """At least one reward, the resolution, the prompt sources, a local ``policy.path`` that exists."""
    if not cfg.rewards:
        raise ConfigError("rewards: no reward is configured; give at least one, e.g. rewards={shapes: 1.0} "
                          "or rewards.pickscore.weight=1.0")
    resolution_fits_policy(cfg)
    for key in ("train", "eval"):
        check_prompt_source(f"data.{key}", getattr(cfg.data, key))
    prompts_fit_policy(cfg)
    load = cfg.policy.common
    if not load.tiny and load.path is not None:
        check_policy_path(load.path)


def check_prompt_source(key: str, src: str) -> None:
    """A ``shapes:<split>`` / ``video_shapes:<split>`` name of an existing split, or an existing .txt / .jsonl
    file."""
    from flowrl.data.prompts import WORLDS

    world, _, split = src.partition(":")
    if world in WORLDS and split:
        from flowrl.data.shapes.splits import SPLITS as IMAGE_SPLITS
        from flowrl.data.video_shapes.splits import SPLITS as VIDEO_SPLITS

        splits = VIDEO_SPLITS if world == "video_shapes" else IMAGE_SPLITS
        if split not in splits:
            raise ConfigError(f"{key}: unknown {world} split {split!r}; expected one of "
                              f"{[f'{world}:{s}' for s in splits]}")
        return
    if not Path(src).expanduser().is_file():
        raise ConfigError(f"{key}: prompt file {src!r} not found; give a .txt file (one prompt per line), a "
                          ".jsonl file with a 'prompt' key, shapes:train / shapes:heldout or "
                          "video_shapes:train / video_shapes:heldout")


def prompts_fit_policy(cfg) -> None:
    """Prompts with source images need a policy with ``accepts_images``; a policy with ``requires_images``
    (editing) needs a source on every prompt. Read from the family class: the flags, never the family name."""
    from flowrl.config.loader import resolve_registry
    from flowrl.data.images import IMAGES_KEY
    from flowrl.data.prompts import load_prompts

    cls = resolve_registry("flowrl.policies:POLICIES").get(cfg.policy.kind)
    accepts, requires = getattr(cls, "accepts_images", False), getattr(cls, "requires_images", False)
    for key in ("train", "eval"):
        src = getattr(cfg.data, key)
        if (accepts and not requires) or (not accepts and not src.endswith(".jsonl")):
            continue                   # nothing to refuse: only a .jsonl line carries images
        if not src.endswith(".jsonl"):
            raise ConfigError(f"data.{key}: policy {cfg.policy.kind!r} needs a source image on every prompt; "
                              f"{src} has none (give a .jsonl with 'image' keys, docs/config.md \"Prompt files\")")
        with_image = [bool(m.get(IMAGES_KEY)) for _, m in load_prompts(src).items]
        if any(with_image) and not accepts:
            raise ConfigError(f"data.{key}: {src} has prompts with source images but policy {cfg.policy.kind!r} "
                              "does not accept images; use an image-conditioned family (e.g. qwen_image_edit)")
        if requires and not all(with_image):
            raise ConfigError(f"data.{key}: policy {cfg.policy.kind!r} needs a source image on every prompt; line "
                              f"{with_image.index(False) + 1} of {src} has none (add 'image' / 'images')")


def check_policy_path(path: str) -> None:
    """A path that names a local location must exist; ``org/name`` hub ids are left to the loader."""
    p = Path(path).expanduser()
    if p.exists():
        return
    local = path.startswith(("/", ".", "~")) or Path(p.parts[0]).exists() or not re.fullmatch(
        r"[\w.\-]+/[\w.\-]+", path)
    if local:
        raise ConfigError(f"policy.path: {path!r} does not exist (a local checkpoint directory, or a hub id "
                          "'org/name'; null: the family's default checkpoint)")


__all__ = ["SEED_MAX", "check_range", "check_startable", "range_text", "validate_run"]
