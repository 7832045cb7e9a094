"""Raw modules of the toy text-to-image model of the shapes world: a word-level tokenizer, a small CLIP text
encoder and a small SD3 transformer working directly in pixel space, plus their save/load.

The classes are the real ones (``tokenizers.Tokenizer`` WordLevel, transformers ``CLIPTextModelWithProjection``,
diffusers ``SD3Transformer2DModel``) with small configs, so loading goes through the real ``from_pretrained``
code. Pixel space: latents are x0 = 2·pixels − 1 (3, 32, 32); one 8×8 patch per grid cell of the world.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor

MAX_TOKENS = 16
SPECIAL_TOKENS = {"<pad>": 0, "<bos>": 1, "<unk>": 2, "<eos>": 3}  # eos ≠ 2: CLIP pools at the first eos id

PRESETS = {
    # ~9.5M-parameter transformer + ~0.5M text encoder: the shipped checkpoint.
    "small": {"text": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "projection_dim": 128},
              "transformer": {"num_layers": 4, "attention_head_dim": 64, "num_attention_heads": 4,
                              "caption_projection_dim": 256}},
    # a few-thousand-parameter model for tests.
    "tiny": {"text": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                      "num_attention_heads": 2, "projection_dim": 32},
             "transformer": {"num_layers": 1, "attention_head_dim": 8, "num_attention_heads": 2,
                             "caption_projection_dim": 16}},
}


def default_asset_dir() -> Path:
    """flowrl/assets/toy/ inside the installed package (the shipped checkpoint)."""
    return Path(str(resources.files("flowrl") / "assets" / "toy"))


def build_tokenizer(words: list[str] | None = None, max_tokens: int = MAX_TOKENS):
    """Word-level tokenizer over the grammar's vocabulary: lowercase, split on whitespace/punctuation,
    ``<bos> words <eos>`` padded with ``<pad>`` (and truncated) to ``max_tokens``; unknown words → ``<unk>``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    if words is None:
        from flowrl.data.shapes.grammar import vocabulary
        words = vocabulary()
    vocab = dict(SPECIAL_TOKENS)
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>",
        special_tokens=[("<bos>", SPECIAL_TOKENS["<bos>"]), ("<eos>", SPECIAL_TOKENS["<eos>"])])
    tok.enable_truncation(max_tokens)
    tok.enable_padding(pad_id=SPECIAL_TOKENS["<pad>"], pad_token="<pad>", length=max_tokens)
    return tok


def tokenize(tokenizer, prompts: list[str]) -> Tensor:
    """Token ids (B, MAX_TOKENS) int64."""
    return torch.tensor([e.ids for e in tokenizer.encode_batch(list(prompts))], dtype=torch.long)


def build_text_encoder(vocab_size: int, preset: str = "small"):
    """A randomly initialised CLIPTextModelWithProjection of the preset's size."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(vocab_size=vocab_size, max_position_embeddings=MAX_TOKENS, hidden_act="gelu",
                         pad_token_id=SPECIAL_TOKENS["<pad>"], bos_token_id=SPECIAL_TOKENS["<bos>"],
                         eos_token_id=SPECIAL_TOKENS["<eos>"], **PRESETS[preset]["text"])
    return CLIPTextModelWithProjection(cfg)


def build_transformer(text_encoder, preset: str = "small"):
    """A randomly initialised SD3Transformer2DModel on 3-channel 32×32 pixels with 8×8 patches, attending to
    the text encoder's last hidden states and conditioned on its projected pooled embedding."""
    from diffusers import SD3Transformer2DModel

    tc = text_encoder.config
    return SD3Transformer2DModel(sample_size=32, patch_size=8, in_channels=3, out_channels=3,
                                 pos_embed_max_size=4, joint_attention_dim=tc.hidden_size,
                                 pooled_projection_dim=tc.projection_dim, **PRESETS[preset]["transformer"])


def build_modules(preset: str = "small", seed: int = 0):
    """(tokenizer, text_encoder, transformer), freshly initialised from ``seed``."""
    if preset not in PRESETS:
        raise ValueError(f"unknown toy preset {preset!r}; expected one of {sorted(PRESETS)}")
    torch.manual_seed(seed)
    tok = build_tokenizer()
    te = build_text_encoder(tok.get_vocab_size(), preset)
    return tok, te, build_transformer(te, preset)


def encode_text(text_encoder, ids: Tensor) -> tuple[Tensor, Tensor]:
    """(prompt_embeds (B, L, D) = last hidden states, pooled (B, P) = projected eos embedding)."""
    out = text_encoder(input_ids=ids)
    return out.last_hidden_state, out.text_embeds


def predict_velocity(transformer, x: Tensor, sigma: Tensor, embeds: Tensor, pooled: Tensor) -> Tensor:
    """v_θ(x, σ, c) with diffusers' SD3 timestep convention t = 1000·σ."""
    t = (sigma.reshape(-1) * 1000.0).expand(x.shape[0]).to(x.dtype)
    return transformer(hidden_states=x, encoder_hidden_states=embeds, pooled_projections=pooled,
                       timestep=t, return_dict=False)[0]


@torch.no_grad()
def ema_update(ema_modules, modules, decay: float) -> None:
    """θ_ema ← decay·θ_ema + (1 − decay)·θ for each module pair (the pretraining scripts' EMA)."""
    for em, m in zip(ema_modules, modules, strict=True):
        for pe, p in zip(em.parameters(), m.parameters(), strict=True):
            pe.lerp_(p, 1 - decay)


def save_modules(directory: str | Path, tokenizer, text_encoder, transformer,
                 dtype: torch.dtype = torch.float16, info: dict | None = None) -> Path:
    """Write ``tokenizer.json``, ``text_encoder/``, ``transformer/`` (safetensors in ``dtype``) and an
    optional ``info.json`` under ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(d / "tokenizer.json"))
    for name, mod in (("text_encoder", text_encoder), ("transformer", transformer)):
        orig = next(mod.parameters()).dtype
        mod.to(dtype).save_pretrained(d / name)
        mod.to(orig)
    if info is not None:
        (d / "info.json").write_text(json.dumps(info, indent=2, sort_keys=True))
    return d


def load_modules(directory: str | Path | None = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32):
    """(tokenizer, text_encoder, transformer) from a directory written by ``save_modules``
    (default: the shipped checkpoint), in eval mode on ``device`` / ``dtype``."""
    from diffusers import SD3Transformer2DModel
    from tokenizers import Tokenizer
    from transformers import CLIPTextModelWithProjection

    d = Path(directory) if directory is not None else default_asset_dir()
    if not (d / "transformer" / "config.json").exists():
        raise FileNotFoundError(f"no toy checkpoint in {d} (expected transformer/, text_encoder/, tokenizer.json); "
                                "train one with scripts/pretrain_toy.py, or pass None for the shipped one")
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    te = CLIPTextModelWithProjection.from_pretrained(d / "text_encoder", dtype=dtype).to(device).eval()
    tr = SD3Transformer2DModel.from_pretrained(d / "transformer", torch_dtype=dtype).to(device).eval()
    return tok, te, tr
