"""The distillation run config (YAML recipes in ``configs/distill/``), loaded strictly by ``flowrl.config.loader``.

Sections shared with the RL run schema (``flowrl.config.schema``, same dataclasses, same meaning): ``run`` (name,
output dir, seed, resume/restart, precision, cpu, threads), ``data`` (prompt sources, negative prompt),
``checkpoint`` (every, keep) and ``log``. Distillation's own: ``model`` (the three roles), ``rollout``, ``dmd``,
``train`` (two optimisers, critic:generator ratio, EMA start) and ``method``, a tagged section resolved through
``flowrl.distill.methods.METHODS`` (``{kind: rmd, chunk_stage_iterations: 900, ...}``).

Defaults are Self-Forcing's published DMD recipe (``guandeh17/Self-Forcing`` ``configs/self_forcing_dmd.yaml`` +
``default_config.yaml``) except where a section says otherwise; the tiny CPU recipe overrides sizes only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from flowrl.config.loader import load_yaml, nested_plugin
from flowrl.config.schema import CheckpointSection, DataSection, LogSection, RunSection
from flowrl.config.validate import check_range
from flowrl.distill.dmd import DMDConfig

METHODS = "flowrl.distill.methods:METHODS"

WAN_NEGATIVE_PROMPT = ("色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，"
                       "静止，整体发灰，最差质量，低质量，"
                       "JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，"
                       "手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走")
"""Wan2.1's default negative prompt (the unconditional branch of the real score in Self-Forcing)."""


@dataclass
class ModelConfig:
    """Where the three roles come from. Empty paths with ``tiny: true`` build diffusers' tiny Wan offline."""

    tiny: bool = True
    policy: str = ""             # build every role from a flowrl WanPolicy: "tiny" or a diffusers Wan dir
    teacher: str = ""            # diffusers Wan checkpoint dir (Self-Forcing: Wan2.1-T2V-14B)
    student_init: str = ""       # bidirectional (or causal) Wan checkpoint for the student; "" = teacher
    critic_init: str = ""        # fake-score init; "" = student_init
    student_original: str = ""   # then overwrite the student with an original-format .pt (Self-Forcing ode_init.pt)
    student_original_key: str = "generator"   # entry of that .pt ("generator" | "generator_ema")
    text_encoder: str = ""       # Wan checkpoint dir with text_encoder/ + tokenizer/; "" = offline hash encoder
    vae: str = ""                # Wan checkpoint dir with vae/; "" = tiny VAE
    dtype: str = "float32"       # "bfloat16" for real models
    chunk_frames: int = 3        # latent frames per causal block (num_frame_per_block)
    window_frames: int | None = None   # rolling attention window incl. sink (local_attn_size); None = global
    sink_frames: int = 0
    gradient_checkpointing: bool = False
    text_len: int = 512


@dataclass
class RolloutConfig:
    """Self-forcing rollout: latent video size and the few-step schedule."""

    num_frames: int = 21         # latent frames (81 pixel frames)
    height: int = 60             # latent height (480 px)
    width: int = 104             # latent width (832 px)
    steps: str = "self_forcing"  # preset in flowrl.distill.schedule.PRESETS
    same_exit_across_chunks: bool = True
    last_step_only: bool = False
    renoise: Literal["sde", "ode"] = "sde"   # fresh ε (Self-Forcing) | the predicted ε̂
    context_noise: float = 0.0


@dataclass
class DistillData(DataSection):
    """The run schema's ``data`` section; only the negative prompt's default differs (Wan2.1's own)."""

    negative_prompt: str = WAN_NEGATIVE_PROMPT


@dataclass
class TrainConfig:
    """Two AdamW optimisers (generator, critic), the critic:generator update ratio and the generator EMA. The
    RL ``train`` section's group/micro-batch/epoch fields have no meaning here, so this is its own dataclass."""

    iterations: int = 600
    batch_size: int = 1                   # videos per process per update
    lr_generator: float = 2e-6
    lr_critic: float = 4e-7
    betas_generator: tuple[float, float] = (0.0, 0.999)
    betas_critic: tuple[float, float] = (0.0, 0.999)
    weight_decay: float = 0.01
    max_grad_norm: float = 10.0
    critic_steps_per_generator: int = 5   # dfake_gen_update_ratio
    ema_decay: float = 0.99
    ema_start_step: int = 200

    def __post_init__(self):
        for name in ("iterations", "batch_size", "critic_steps_per_generator"):
            check_range(f"train.{name}", getattr(self, name), ge=1)


@dataclass
class DistillConfig:
    run: RunSection = field(default_factory=RunSection)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DistillData = field(default_factory=DistillData)
    method: Any = nested_plugin(METHODS, "dmd")   # tagged: the method and its own settings
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    dmd: DMDConfig = field(default_factory=DMDConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    log: LogSection = field(default_factory=LogSection)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name


def prompt_list(source: str) -> list[str]:
    """The prompts of a ``data.train`` / ``data.eval`` source (``flowrl.data.prompts.load_prompts``), in order."""
    from flowrl.data.prompts import load_prompts

    return [p for p, _ in load_prompts(source).fixed(None)]


def load_config(path: str | None, overrides: list[str] | None = None) -> DistillConfig:
    """A recipe file plus dotted ``key=value`` overrides → ``DistillConfig`` (strict: unknown keys fail)."""
    return load_yaml(DistillConfig, path, overrides)
