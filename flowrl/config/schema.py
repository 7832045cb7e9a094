"""The typed run configuration: ``RunConfig`` sections, YAML recipes, dotted ``key=value`` overrides.

    cfg = load_config("configs/default.yaml", ["train.lr=1e-4", "rewards.shapes.weight=0.5"])

Sections: ``run`` (name, output dir, seed, resume, precision), ``policy`` (tagged: POLICIES),
``data`` (prompt sets), ``sampler`` (steps, guidance, resolution, and the tagged ``kernel`` / ``window``),
``rewards`` (keyed by name, each ``{weight, reward?, kwargs, ...}`` as in ``rewards.compose``), ``advantage`` (group
statistics + tagged ``balancer``), ``objective`` (tagged: OBJECTIVES), ``train``, ``eval``, ``checkpoint``, ``log``,
``dist`` (sharding). A recipe holds only non-default values; defaults are the Flow-GRPO / DiffusionNFT published
ones (flow_grpo ``config/base.py``, DiffusionNFT ``config/nft.py``). Everything strict: an unknown key or a
wrong type names the key, its file and the nearest valid key. The resolved config is written to
``<run dir>/config.yaml``; resume reads that file (``load_resolved``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from flowrl.config.loader import (
    ConfigError,
    Source,
    apply_overrides,
    dump_yaml,
    from_dict,
    parse_yaml,
    plugin_config_class,
    plugin_field,
    read_yaml_file,
    replace_nested,
)
from flowrl.config.validate import SEED_MAX, check_range, validate_run

POLICIES = "flowrl.policies:POLICIES"
KERNELS = "samplers:KERNELS"
WINDOWS = "samplers:WINDOWS"
OBJECTIVES = "flowrl.objectives:OBJECTIVES"
BALANCERS = "flowrl.balancers:BALANCERS"
REWARDS = "rewards:REWARDS"


@dataclass
class RunSection:
    name: str = "default"
    output_dir: str = "runs"          # the run lives in <output_dir>/<name>/
    seed: int = 42
    resume: Any = False               # true / false / "auto": resume when the run dir holds a checkpoint, else
    #                                   start fresh (job arrays, torchrun restarts); true: continue (config.yaml)
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"   # Flow-GRPO: fp16 SD3, bf16 FLUX/Wan (README FAQ)
    cpu: bool = False                 # force CPU even when an accelerator is present
    threads: int | None = None        # torch CPU threads (None: torch's default); 1 is fastest for tiny models
    restart: bool = False             # start over in a run dir that holds checkpoints (they are deleted first)
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])  # stop cleanly on these

    def __post_init__(self):
        check_range("run.seed", self.seed, ge=0, le=SEED_MAX)
        check_range("run.threads", self.threads, ge=1, optional="torch's default")
        if not self.name or self.name in (".", "..") or "/" in self.name:
            raise ValueError(f"run.name must be a plain directory name (the run lives in "
                             f"<run.output_dir>/<run.name>), got {self.name!r}")
        if not (isinstance(self.resume, bool) or self.resume == "auto"):
            raise ValueError(f"run.resume must be true, false or auto, got {self.resume!r}")
        if self.resume and self.restart:
            raise ValueError("resume and restart cannot both be set: run.resume continues the run in its "
                             "directory, run.restart deletes its checkpoints and starts over")
        from flowrl.training.preemption import signal_names

        self.preempt_signals = signal_names(self.preempt_signals)


@dataclass
class PolicyLoad:
    """Where a policy's weights come from; accepted by every ``policy: {kind: ...}`` besides its own Config."""

    path: str | None = None           # hub id or local dir; None → the family's default (toy: the shipped checkpoint)
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"   # transformer / text encoders; VAE stays fp32
    tiny: bool = False                # build the family's tiny random preset (tests, dry runs; no download)
    compile: bool = False             # torch.compile the transformer(s) for rollouts and training (lossy ~1e-5)


@dataclass
class DataSection:
    train: str = "shapes:train"       # prompt set: registered name ("shapes:train"), a .txt (one per line) or .jsonl
    eval: str = "shapes:heldout"      # held-out prompts for accuracy / reward before-after
    negative_prompt: str = ""         # CFG negative prompt


def optional_section(target: str):
    """Builder of an optional section whose dataclass lives with its code (``"module:Class"``, imported when
    the section is given): null → None, a mapping → that dataclass, strictly."""

    def build(data: Any, where: str, source: Source | None) -> Any:
        if data is None:
            return None
        from flowrl.registry import import_string

        return from_dict(import_string(target), data, where, source)

    return build


@dataclass
class SamplerSection:
    kernel: Any = plugin_field(KERNELS, "flow_sde")   # rollout step kernel (SDE for GRPO, ODE/solver for NFT/AWR)
    window: Any = plugin_field(WINDOWS, "all")        # which steps are stochastic + stored (Flow-GRPO-Fast, MixGRPO)
    steps: int = 10                   # rollout steps (Flow-GRPO SD3.5: 10 train, 40 eval)
    eval_steps: int = 40
    guidance: float | None = None     # CFG / distilled guidance for rollouts; None → the policy family default
    eval_guidance: float | None = None
    height: int = 512
    width: int = 512
    num_frames: int | None = None     # video policies only
    chunk: int | None = 8             # rows per rollout model call per process (the forward batch; a cap, the last
                                      # chunk may be smaller); null: all of this process's rows at once
    log_prob_reduce: Literal["mean", "sum"] = "mean"   # over latent elements (the anchors' mean); GRPO re-scores
                                                      # its stored steps with the same reduction
    tree: Any = field(default=None, metadata={"build": optional_section("samplers.tree_config:TreeConfig")})
    # None: flat rollouts; {preset: branchgrpo, ...}: one branching tree per prompt (docs/training.md "Trees")
    pool: Any = field(default=None, metadata={"build": optional_section("flowrl.pools.stage:PoolConfig")})
    # None: no pool; {candidates: N, scout: {kind: x0_exit}, ...}: scout N seeds per prompt, regenerate the
    # train.group_size kept ones (docs/training.md "Candidate pools")
    restart: Any = field(default=None, metadata={"build": optional_section("samplers.restart:Config")})
    accelerate: Any = plugin_field("flowrl.accelerators:ACCELERATORS", "exact")
    # the training rollout's forwards: exact, cache {every}, fp4 {fmt}, precision {dtype} (lossy ones need
    # sampler.correction under a ratio-based objective; docs/training.md "Throughput")
    correction: Any = field(default=None, metadata={
        "build": optional_section("flowrl.objectives.rollout_correction:RolloutCorrection")})
    # None: off; {is_level: sequence, is_threshold: 2.0, rs: null}: TIS / RS weights of a lossy rollout
    # None: plain ODE; {intervals: [{t_min, t_max, n_steps, K}]}: Restart sampling for deterministic-kernel
    # rollouts (forward-process objectives): forward noise jumps + ODE passes (samplers/restart.py)

    def __post_init__(self):   # the resolution's multiples are the policy family's (config.validate)
        for name in ("steps", "eval_steps", "height", "width"):
            check_range(f"sampler.{name}", getattr(self, name), ge=1)
        check_range("sampler.num_frames", self.num_frames, ge=1, optional="images")
        check_range("sampler.chunk", self.chunk, ge=1, optional="all rows at once")
        for name in ("guidance", "eval_guidance"):
            check_range(f"sampler.{name}", getattr(self, name), ge=0, optional="the family's default")


def build_rewards(data: Any, where: str, source: Source | None) -> dict:
    """``{name: weight | {weight, reward?, kwargs, device, dtype, batch_size}}`` → ``{name: RewardSpec}``
    (``rewards.compose.RewardSpec``), strictly; ``kwargs`` is checked against the reward's own ``Config``."""
    from rewards import REWARDS
    from rewards.compose import RewardSpec

    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping name → {{weight: ...}} (rewards are keyed by name, "
                          f"not a list) (in {source.of(where) if source else 'config'})")
    out = {}
    for name, spec in data.items():
        key = f"{where}.{name}"
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            spec = {"weight": spec}
        spec = dict(spec or {})
        if spec.pop("name", name) != name:   # a resolved config.yaml repeats the key as `name`
            raise ConfigError(f"{key}.name: must equal the mapping key {name!r} "
                              f"(in {source.of(key) if source else 'config'})")
        built = from_dict(RewardSpec, {**spec, "name": str(name)}, key, source)
        try:
            obj = REWARDS.get(built.target)
        except KeyError as e:
            raise ConfigError(f"{key}: {e} (in {source.of(key) if source else 'config'})") from None
        cfg_cls = plugin_config_class(obj)
        if cfg_cls is not None:
            from_dict(cfg_cls, built.kwargs, f"{key}.kwargs", source)   # validation only; kwargs stay a dict
        out[str(name)] = built
    return out


@dataclass
class AdvantageSection:
    """Rewards R (N, K) → advantages (N,) by the tagged ``balancer`` (its Config holds the std mode: Flow-GRPO's
    A = (r − mean_group r) / (std + 1e-4), std over the batch or the group). The clip |A| ≤ C is the
    objective's (``objective.adv_clip_max``), as in every anchor. ``diagnose_every`` N > 0 logs, every N
    iterations, the cosine of each reward's gradient with the applied update (``balance/cos_<reward>``,
    ``balance/neg_cos_any``; K + 1 extra backward passes on one micro-batch; flowrl/training/advantage.py)."""

    balancer: Any = plugin_field(BALANCERS, "weighted_sum")
    diagnose_every: int = 0           # iterations between conflict diagnostics (0: off)

    def __post_init__(self):
        if self.diagnose_every < 0:
            raise ValueError(f"advantage.diagnose_every must be ≥ 0 (0: off), got {self.diagnose_every}")


@dataclass
class TrainSection:
    iterations: int = 100             # outer RL iterations (rollout → update)
    prompts_per_iter: int = 48        # groups per iteration, over all processes (Flow-GRPO: 48)
    group_size: int = 24              # samples per prompt (Flow-GRPO / NFT: 24)
    micro_batch: int = 8              # rows per forward/backward per process (a cap: min(micro_batch, rows of one
                                      # update) is used, and it must divide them; train.updates_per_epoch sets those)
    inner_epochs: int = 1             # K passes over each iteration's samples
    updates_per_epoch: int = 2        # optimizer steps per pass (Flow-GRPO: GA = batches/2 → 2 steps)
    lr: float = 3.0e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 1.0e-4
    eps: float = 1.0e-8
    max_grad_norm: float = 1.0
    ema_decay: float | None = 0.9     # eval EMA of the trainable weights (None: off); warm-up min((1+s)/(10+s), d)
    ema_every: int = 8                # optimizer steps between EMA updates (Flow-GRPO 8; NFT 1)
    max_skipped: int = 10             # stop after this many consecutive skipped updates (non-finite values)
    async_rewards: bool = False       # score each rollout chunk in a worker thread while the next one samples
                                      # (same rewards and training as the synchronous run)

    def __post_init__(self):
        for name in ("iterations", "prompts_per_iter", "micro_batch", "inner_epochs", "updates_per_epoch",
                     "ema_every", "max_skipped"):
            check_range(f"train.{name}", getattr(self, name), ge=1)
        if self.group_size < 2:
            raise ValueError(f"train.group_size must be ≥ 2, got {self.group_size}: advantages are relative to "
                             "each prompt's group (every balancer subtracts the group's mean or median), so a "
                             "group of one sample has zero advantage")
        for name in ("lr", "eps", "max_grad_norm"):
            check_range(f"train.{name}", getattr(self, name), gt=0)
        check_range("train.weight_decay", self.weight_decay, ge=0)
        for i, beta in enumerate(self.betas):
            check_range(f"train.betas[{i}]", beta, ge=0, lt=1)
        check_range("train.ema_decay", self.ema_decay, ge=0, lt=1, optional="no eval EMA")


@dataclass
class EvalSection:
    every: int = 20                   # iterations between evaluations (0: only before and after)
    num_prompts: int | None = 64      # held-out prompts scored per evaluation (None: all)
    grid_prompts: int = 8             # rows of the saved image grid
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    held_out: list[str] = field(default_factory=list)   # extra rewards monitored, never trained on
    batch: int = 16
    before: bool = True
    after: bool = True

    def __post_init__(self):
        check_range("eval.every", self.every, ge=0)
        check_range("eval.num_prompts", self.num_prompts, ge=1, optional="all held-out prompts")
        check_range("eval.grid_prompts", self.grid_prompts, ge=0)
        check_range("eval.batch", self.batch, ge=1)
        if not self.seeds:
            raise ValueError("eval.seeds must hold at least one seed, got []")
        for i, seed in enumerate(self.seeds):
            check_range(f"eval.seeds[{i}]", seed, ge=0, le=2**63 - 1)


@dataclass
class CheckpointSection:
    every: int = 50                   # iterations between checkpoints (0: only at the end)
    keep: int = 2                     # newest checkpoints kept (older ones are deleted after each save)
    async_save: bool = False          # sharded (dist.fsdp) runs: write the DCP shards while training goes on; each
                                      # checkpoint is completed (hashes, manifest, rename) at the next save or run end

    def __post_init__(self):
        check_range("checkpoint.every", self.every, ge=0)
        check_range("checkpoint.keep", self.keep, ge=1)


@dataclass
class LogSection:
    every: int = 1
    tensorboard: bool = False
    wandb: bool = False
    project: str = "flowrl"
    progress: bool = True             # tqdm bars with ETA

    def __post_init__(self):
        check_range("log.every", self.every, ge=1)


@dataclass
class DistSection:
    """Sharding across processes (flowrl/distributed/fsdp.py, docs/training.md "Multi-GPU and multi-node")."""

    fsdp: bool = False                # FSDP2 (torch fully_shard): each process holds 1/N of the transformer's
                                      # weights, gradients and optimizer state; also on when accelerate's FSDP
                                      # config is active
    reshard_after_forward: bool = True   # free a block's gathered weights after its forward (ZeRO-3; rollouts
                                         # and the frozen copies too); false keeps them until backward
    reduce_per_step: bool = True      # reduce-scatter gradients once per optimizer step, accumulated unsharded
                                      # over its micro-batches (the unsharded run's arithmetic, bit for bit);
                                      # false: after every backward (only gradient chunks are ever held)


@dataclass
class RunConfig:
    run: RunSection = field(default_factory=RunSection)
    policy: Any = plugin_field(POLICIES, "toy", common=PolicyLoad)
    data: DataSection = field(default_factory=DataSection)
    sampler: SamplerSection = field(default_factory=SamplerSection)
    rewards: dict = field(default_factory=dict, metadata={"build": build_rewards})
    advantage: AdvantageSection = field(default_factory=AdvantageSection)
    objective: Any = plugin_field(OBJECTIVES, "grpo")
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    log: LogSection = field(default_factory=LogSection)
    dist: DistSection = field(default_factory=DistSection)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name

    @property
    def samples_per_iter(self) -> int:
        return self.train.prompts_per_iter * self.train.group_size


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Load a recipe, apply ``key=value`` overrides, build the ``RunConfig`` strictly and check the settings
    that depend on each other (``flowrl.config.validate.validate_run``); nothing is built or loaded."""
    data = read_yaml_file(path) if path is not None else {}
    source = Source(str(path) if path is not None else None)
    apply_overrides(data, list(overrides or []), source)
    cfg = from_dict(RunConfig, data, "", source)
    validate_run(cfg, source)
    return cfg


def check_geometry(cfg: RunConfig, num_processes: int = 1) -> None:
    """The batch must split evenly: samples per iteration over processes, then each process's samples into
    ``train.updates_per_epoch`` updates, each into micro-batches of min(``train.micro_batch``, rows per update).
    ``micro_batch`` is a cap, so a recipe runs unchanged on any process count that divides its samples; what
    cannot split is refused with the valid values instead of adjusting anything."""
    n, p, updates = cfg.samples_per_iter, num_processes, cfg.train.updates_per_epoch
    if n % p:
        raise ConfigError(f"train.prompts_per_iter × train.group_size = {n} samples do not split over {p} "
                          f"processes; choose prompts_per_iter as a multiple of {p}")
    local = n // p
    if local % updates:
        good = [d for d in range(1, local + 1) if local % d == 0]
        raise ConfigError(f"{local} samples per process do not split into train.updates_per_epoch={updates} "
                          f"updates; valid updates_per_epoch values: {good}")
    rows = local // updates
    if rows % min(cfg.train.micro_batch, rows):
        good = [d for d in range(1, rows + 1) if rows % d == 0]
        raise ConfigError(f"{rows} rows per update per process ({local} samples / {updates} updates) do not "
                          f"split into micro-batches of train.micro_batch={cfg.train.micro_batch}; valid "
                          f"micro_batch values: {good} (or any value ≥ {rows})")


def save_resolved(cfg: RunConfig, run_dir: str | Path | None = None) -> Path:
    """Write the resolved config to ``<run dir>/config.yaml`` (what resume reads), atomically. It describes
    the run, not how it was last launched: ``run.resume`` and ``run.restart`` are written as false."""
    import yaml

    d = Path(run_dir) if run_dir is not None else cfg.run_dir
    d.mkdir(parents=True, exist_ok=True)
    path = d / "config.yaml"
    data = parse_yaml(dump_yaml(cfg))
    data["run"].update(resume=False, restart=False)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None))
    tmp.replace(path)
    return path


def load_resolved(run_dir: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """The config a run was started with (``<run dir>/config.yaml``), plus overrides (e.g. more iterations).
    The run lives where it is now: ``run.output_dir`` / ``run.name`` are set to ``run_dir``'s parent and name
    whatever the file says (a run directory can be moved), and overriding them is refused."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"cannot resume: {path} not found (was the run started with this output_dir/name?)")
    moved = [o for o in overrides or [] if o.lstrip("~").split("=", 1)[0].strip() in ("run.name", "run.output_dir")]
    if moved:
        raise ConfigError(f"{moved[0].lstrip('~').split('=', 1)[0]}: cannot be overridden when resuming "
                          f"{run_dir} (in command-line override {moved[0]!r}); the run continues in its own "
                          "directory: move the directory instead")
    d = Path(run_dir)
    d = d.resolve() if d.name in ("", ".", "..") else d
    cfg = load_config(path, overrides)
    return replace_nested(cfg, **{"run.output_dir": str(d.parent), "run.name": d.name})
