"""The distillation roles — causal student, frozen teacher, trainable critic — plus text encoder and VAE.

Self-Forcing (``model/base.py``): generator = causal Wan initialised from a bidirectional
checkpoint (or an ODE-init), real score = frozen bidirectional teacher, fake score = trainable bidirectional
critic. Teacher and critic are wrapped in ``CausalWan`` too but always called bidirectionally.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from flowrl.distill.causal_wan import CausalWan
from flowrl.distill.components import (
    HashTextEncoder,
    T5TextEncoder,
    original_wan_state_dict,
    tiny_vae,
    tiny_wan,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Roles:
    student: CausalWan
    teacher: CausalWan
    critic: CausalWan | None                  # None for a method that trains no critic (ODE init)
    text_encoder: nn.Module
    vae: nn.Module
    chunk_teacher: CausalWan | None = None
    first_critic: CausalWan | None = None     # RMD's separate first-chunk fake score

    def to(self, device) -> Roles:
        for m in (self.student, self.teacher, self.critic, self.text_encoder, self.vae, self.chunk_teacher,
                  self.first_critic):
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


class PolicyText(nn.Module):
    """Text embeddings from a ``WanPolicy`` (its UMT5 + tokenizer, the pipeline's ``encode_prompt``)."""

    def __init__(self, policy):
        super().__init__()
        self.policy = policy

    def forward(self, prompts) -> Tensor:
        return self.policy.encode(list(prompts), cfg=False).embeds["prompt_embeds"].float()


def roles_from_policy(policy, mc, first_critic: bool = False, critic: bool = True) -> Roles:
    """Teacher = the policy's transformer (frozen); student and critic = float32 copies of it, made causal;
    text encoder and VAE = the policy's."""
    tr = policy.transformer
    student = _wrap(copy.deepcopy(tr).float(), mc)
    critic = _wrap(copy.deepcopy(tr).float(), mc) if critic else None
    first = _wrap(copy.deepcopy(tr).float(), mc) if first_critic else None
    return Roles(student, _wrap(tr, mc), critic, PolicyText(policy), policy.vae, first_critic=first)


def _policy(mc):
    from flowrl.policies.wan import Config, WanPolicy

    cfg = Config(lora=None, max_sequence_length=mc.text_len)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if mc.policy == "tiny":
        return WanPolicy.tiny(config=cfg, device=device)
    return WanPolicy.from_pretrained(mc.policy, dtype=_dtype(mc.dtype), device=device, config=cfg)


def build_roles(mc, chunk_teacher_path: str = "", first_critic: bool = False, critic: bool = True) -> Roles:
    """Build every role from a ``ModelConfig`` (a WanPolicy, tiny offline models, or diffusers checkpoints);
    ``first_critic`` adds RMD's first-chunk critic (initialised like the critic); ``critic=False`` builds none."""
    if mc.policy:
        return _finish(roles_from_policy(_policy(mc), mc, first_critic, critic), mc, chunk_teacher_path)
    first = None
    if mc.tiny and not mc.teacher:
        teacher_tr = tiny_wan(0)
        student = _wrap(copy.deepcopy(teacher_tr), mc)
        critic = _wrap(copy.deepcopy(teacher_tr), mc) if critic else None
        first = _wrap(copy.deepcopy(teacher_tr), mc) if first_critic else None
        teacher = _wrap(teacher_tr, mc)
    else:
        if not mc.teacher:
            raise ValueError("model.teacher is empty: give a diffusers Wan checkpoint dir (or set model.tiny: true)")
        teacher = _load(mc.teacher, mc)
        student = _load(mc.student_init or mc.teacher, mc, trainable=True)
        critic = _load(mc.critic_init or mc.student_init or mc.teacher, mc, trainable=True) if critic else None
        if first_critic:
            first = _load(mc.critic_init or mc.student_init or mc.teacher, mc, trainable=True)
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
    return _finish(Roles(student, teacher, critic, text_encoder, vae, first_critic=first), mc, chunk_teacher_path)


def _finish(roles: Roles, mc, chunk_teacher_path: str) -> Roles:
    """Chunk teacher, frozen roles without grad, optional gradient checkpointing."""
    roles.chunk_teacher = _load(chunk_teacher_path, mc) if chunk_teacher_path else None
    if mc.student_original:
        sd = original_wan_state_dict(mc.student_original, mc.student_original_key)
        roles.student.transformer.load_state_dict(sd)
    for frozen in (roles.teacher, roles.chunk_teacher, roles.vae, roles.text_encoder):
        if frozen is not None:
            frozen.requires_grad_(False).eval()
    if mc.gradient_checkpointing:
        for m in (roles.student, roles.critic, roles.first_critic):
            if m is not None:
                m.transformer.enable_gradient_checkpointing()
    return roles
