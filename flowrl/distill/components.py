"""Model components for distillation: tiny offline Wan transformer/VAE, text encoders, latent (de)normalisation.

Tiny configs are diffusers' own test fixtures (``tests/pipelines/wan/test_wan.py``), built from
config objects — nothing is downloaded. Real checkpoints load through the normal ``from_pretrained`` code.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import Tensor, nn

TINY_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
                out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
"""diffusers' tiny Wan transformer test config (``tests/pipelines/wan/test_wan.py``)."""

TINY_VAE = dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                temperal_downsample=[False, True, True])
"""diffusers' tiny ``AutoencoderKLWan`` test config (latent factors 4 temporal / 8 spatial)."""


def tiny_wan(seed: int = 0, **overrides) -> nn.Module:
    """A tiny ``WanTransformer3DModel`` (≈28k parameters) with deterministic weights."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(**{**TINY_WAN, **overrides})


def tiny_vae(seed: int = 0) -> nn.Module:
    """A tiny ``AutoencoderKLWan`` (≈14k parameters) with deterministic weights."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    return AutoencoderKLWan(**TINY_VAE)


class HashTextEncoder(nn.Module):
    """Offline stand-in text encoder for tiny runs: each whitespace word ↦ a fixed random vector
    (seeded by a hash of the word), padded/truncated to ``max_len`` tokens. Empty prompt ↦ zeros.
    Deterministic across processes, so checkpoints and resumes see identical conditioning."""

    def __init__(self, dim: int = 32, max_len: int = 8):
        super().__init__()
        self.dim, self.max_len = dim, max_len

    def _word(self, word: str) -> Tensor:
        seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
        return torch.randn(self.dim, generator=torch.Generator().manual_seed(seed))

    def forward(self, prompts: Sequence[str]) -> Tensor:
        out = torch.zeros(len(prompts), self.max_len, self.dim)
        for i, p in enumerate(prompts):
            for j, w in enumerate(p.split()[: self.max_len]):
                out[i, j] = self._word(w.lower())
        return out


class T5TextEncoder(nn.Module):
    """Wan's UMT5 text encoder + tokenizer from a diffusers checkpoint (``text_encoder``/``tokenizer``
    subfolders); embeddings past each prompt's length are zeroed as in ``WanPipeline._get_t5_prompt_embeds``."""

    def __init__(self, path: str, max_len: int = 512, torch_dtype=None):
        super().__init__()
        from transformers import AutoTokenizer, UMT5EncoderModel

        self.tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer")
        self.model = UMT5EncoderModel.from_pretrained(path, subfolder="text_encoder", torch_dtype=torch_dtype)
        self.model.requires_grad_(False)
        self.max_len = max_len

    @torch.no_grad()
    def forward(self, prompts: Sequence[str]) -> Tensor:
        tok = self.tokenizer(list(prompts), padding="max_length", max_length=self.max_len, truncation=True,
                             add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
        dev = next(self.model.parameters()).device
        mask = tok.attention_mask.to(dev)
        emb = self.model(tok.input_ids.to(dev), mask).last_hidden_state
        return (emb * mask[..., None]).float()


def latent_stats(vae: nn.Module, like: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, std) shaped (1, C, 1, 1, 1) from the Wan VAE config (``latents_mean``/``latents_std``)."""
    c = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean, dtype=like.dtype, device=like.device).view(1, c, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, dtype=like.dtype, device=like.device).view(1, c, 1, 1, 1)
    return mean, std


def decode_video(vae: nn.Module, latents: Tensor) -> Tensor:
    """Normalised latents (B, C, F, H, W) → pixels (B, F', 3, H', W') in [0, 1] (``WanPipeline`` decode:
    ``z·std + mean``, then ``(x + 1)/2``). Differentiable; wrap in no_grad where no gradient is wanted."""
    mean, std = latent_stats(vae, latents)
    z = latents.to(vae.dtype) * std.to(vae.dtype) + mean.to(vae.dtype)
    video = vae.decode(z, return_dict=False)[0].float()
    return ((video + 1) / 2).clamp(0, 1).permute(0, 2, 1, 3, 4)


ORIGINAL_PREFIXES = ("model.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def original_wan_state_dict(path: str, key: str | None = "generator_ema") -> dict[str, Tensor]:
    """A Self-Forcing / CausVid / RMD ``.pt`` generator checkpoint in diffusers' key names.

    Those checkpoints hold ``{"generator": sd, "generator_ema": sd, ...}`` with original Wan keys under a
    ``model.`` prefix (``WanDiffusionWrapper.model``, FSDP wrappers); keys are renamed with diffusers' own
    ``convert_wan_transformer_to_diffusers`` (the ``TRANSFORMER_KEYS_RENAME_DICT`` of diffusers'
    ``scripts/convert_wan_to_diffusers.py``)."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if key is not None and isinstance(ckpt, dict) and key in ckpt:
        ckpt = ckpt[key]
    elif key is not None and isinstance(ckpt, dict) and any(k in ckpt for k in ("generator", "generator_ema")):
        raise KeyError(f"{path}: no {key!r} entry; it holds {sorted(k for k in ckpt if isinstance(k, str))}")
    sd = {}
    for k, v in ckpt.items():
        changed = True
        while changed:
            changed = False
            for p in ORIGINAL_PREFIXES:
                if k.startswith(p):
                    k, changed = k[len(p):], True
        sd[k] = v
    return convert_wan_transformer_to_diffusers(sd)
