"""The distillation run config (YAML recipes in ``configs/distill/``), loaded strictly by ``flowrl.config.loader``.

Defaults are Self-Forcing's published DMD recipe (``guandeh17/Self-Forcing`` ``configs/self_forcing_dmd.yaml`` +
``default_config.yaml``) except where a section says otherwise; the tiny CPU recipe overrides sizes only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from flowrl.config.loader import load_yaml
from flowrl.distill import ode_init, rmd, stream_r1
from flowrl.distill.dmd import DMDConfig

METHODS = ("dmd", "stream_r1", "rmd", "ode_init")

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
    renoise: str = "sde"         # "sde" | "ode"
    context_noise: float = 0.0


@dataclass
class OptimConfig:
    lr_generator: float = 2e-6
    lr_critic: float = 4e-7
    betas_generator: tuple[float, float] = (0.0, 0.999)
    betas_critic: tuple[float, float] = (0.0, 0.999)
    weight_decay: float = 0.01
    max_grad_norm: float = 10.0
    critic_steps_per_generator: int = 5   # dfake_gen_update_ratio
    ema_decay: float = 0.99
    ema_start_step: int = 200


@dataclass
class DistillConfig:
    method: str = "dmd"
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    dmd: DMDConfig = field(default_factory=DMDConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    stream_r1: stream_r1.Config = field(default_factory=stream_r1.Config)
    rmd: rmd.Config = field(default_factory=rmd.Config)
    ode_init: ode_init.Config = field(default_factory=ode_init.Config)
    prompts: list[str] = field(default_factory=lambda: ["a red fox running through snow"])
    prompt_file: str = ""        # one prompt a line; overrides ``prompts``
    negative_prompt: str = WAN_NEGATIVE_PROMPT
    batch_size: int = 1
    iterations: int = 600
    seed: int = 0
    output_dir: str = "runs/distill"
    save_every: int = 100
    keep_last: int = 3
    log_every: int = 1
    mixed_precision: str | bool = "no"  # accelerate: "no" | "bf16" | "fp16" (YAML's bare `no` reads as false)

    def __post_init__(self):
        if self.mixed_precision is False:
            self.mixed_precision = "no"
        if self.mixed_precision not in ("no", "bf16", "fp16"):
            raise ValueError(f"mixed_precision must be 'no', 'bf16' or 'fp16', got {self.mixed_precision!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.optim.critic_steps_per_generator < 1:
            raise ValueError("optim.critic_steps_per_generator must be >= 1")

    def prompt_list(self) -> list[str]:
        if self.prompt_file:
            lines = [s.strip() for s in Path(self.prompt_file).read_text().splitlines()]
            prompts = [s for s in lines if s]
            if not prompts:
                raise ValueError(f"prompt_file {self.prompt_file!r} holds no prompts")
            return prompts
        return list(self.prompts)


def load_config(path: str | None, overrides: list[str] | None = None) -> DistillConfig:
    """A recipe file plus dotted ``key=value`` overrides → ``DistillConfig`` (strict: unknown keys fail)."""
    return load_yaml(DistillConfig, path, overrides)
