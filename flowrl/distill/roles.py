"""The distillation roles — causal student, frozen teacher, trainable critic — plus text encoder and VAE.

Self-Forcing (reference D §1.1, ``model/base.py``): generator = causal Wan initialised from a bidirectional
checkpoint (or an ODE-init), real score = frozen bidirectional teacher, fake score = trainable bidirectional
critic. Teacher and critic are wrapped in ``CausalWan`` too but always called bidirectionally.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from flowrl.distill.causal_wan import CausalWan
from flowrl.distill.components import HashTextEncoder, T5TextEncoder, tiny_vae, tiny_wan

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Roles:
    student: CausalWan
    teacher: CausalWan
    critic: CausalWan
    text_encoder: nn.Module
    vae: nn.Module
    chunk_teacher: CausalWan | None = None

    def to(self, device) -> "Roles":
        for m in (self.student, self.teacher, self.critic, self.text_encoder, self.vae, self.chunk_teacher):
            if m is not None:
                m.to(device)
        return self


def bidirectional_score(model: CausalWan):
    """``v = f(x_t, t, text)`` running ``model`` without the causal mask (a DMD real/fake score)."""
    def score(x: Tensor, t: Tensor, text: Tensor) -> Tensor:
        return model(x.to(model.transformer.dtype), t, text.to(model.transformer.dtype), causal=False).float()
    return score


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def _wrap(transformer: nn.Module, mc) -> CausalWan:
    return CausalWan(transformer, mc.chunk_frames, mc.window_frames, mc.sink_frames)


def _load(path: str, mc, trainable: bool = False) -> CausalWan:
    """Trainable roles keep float32 master weights (bf16 compute comes from accelerate's autocast; a 2e-6
    step on bf16 weights would round away); frozen roles load in ``model.dtype``."""
    dtype = torch.float32 if trainable else _dtype(mc.dtype)
    return CausalWan.from_pretrained(path, torch_dtype=dtype, chunk_frames=mc.chunk_frames,
                                     window_frames=mc.window_frames, sink_frames=mc.sink_frames)


def build_roles(mc, chunk_teacher_path: str = "") -> Roles:
    """Build every role from a ``ModelConfig`` (tiny offline models, or diffusers checkpoints)."""
    if mc.tiny and not mc.teacher:
        teacher_tr = tiny_wan(0)
        student = _wrap(copy.deepcopy(teacher_tr), mc)
        critic = _wrap(copy.deepcopy(teacher_tr), mc)
        teacher = _wrap(teacher_tr, mc)
    else:
        if not mc.teacher:
            raise ValueError("model.teacher is empty: give a diffusers Wan checkpoint dir (or set model.tiny: true)")
        teacher = _load(mc.teacher, mc)
        student = _load(mc.student_init or mc.teacher, mc, trainable=True)
        critic = _load(mc.critic_init or mc.student_init or mc.teacher, mc, trainable=True)
    text_dim = teacher.transformer.config.text_dim
    if mc.text_encoder:
        text_encoder = T5TextEncoder(mc.text_encoder, mc.text_len, _dtype(mc.dtype))
    else:
        text_encoder = HashTextEncoder(text_dim)
    if mc.vae:
        from diffusers import AutoencoderKLWan

        vae = AutoencoderKLWan.from_pretrained(mc.vae, subfolder="vae", torch_dtype=torch.float32)
    else:
        vae = tiny_vae(0)
    chunk_teacher = _load(chunk_teacher_path, mc) if chunk_teacher_path else None
    for frozen in (teacher, chunk_teacher, vae, text_encoder):
        if frozen is not None:
            frozen.requires_grad_(False).eval()
    if mc.gradient_checkpointing:
        student.transformer.enable_gradient_checkpointing()
        critic.transformer.enable_gradient_checkpointing()
    return Roles(student, teacher, critic, text_encoder, vae, chunk_teacher)
