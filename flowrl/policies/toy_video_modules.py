"""Raw modules of the tiny video teacher of the moving-shapes world: a word-level tokenizer, a small UMT5 text
encoder and a small bidirectional ``WanTransformer3DModel`` working directly in pixel space, plus save/load.

The classes are the real ones (``tokenizers`` WordLevel, transformers ``UMT5EncoderModel`` — Wan2.1's text
encoder class — and diffusers ``WanTransformer3DModel``) with small configs. Pixel space, as the image toy: latents
x0 = 2·pixels − 1 laid out (3, F, H, W), patches (1, p, p), so there is no VAE to train or ship.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch
from torch import Tensor

from flowrl.policies.toy_modules import SPECIAL_TOKENS, build_tokenizer, save_modules, tokenize

MAX_TOKENS = 24       # the longest prompt ("a purple triangle, then …, then a green circle appear") is 17 tokens

_TEXT = {"d_model": 128, "d_ff": 256, "d_kv": 32, "num_heads": 4, "num_layers": 2}
_WIDE = {"num_attention_heads": 4, "attention_head_dim": 64, "ffn_dim": 512, "num_layers": 4}
PRESETS = {
    # 3.9M-parameter transformer (width 256, 4 blocks, 8×8 patches: 16 tokens a frame, 128 for 8 frames) + 0.3M
    # text encoder. Measured on the shared 2-core CPU, 1 thread, batch 16: 0.74 s per step (docs/video.md).
    "small": {"text": _TEXT, "transformer": {"patch_size": (1, 8, 8), **_WIDE}},
    # the same with 4×4 patches (512 tokens for 8 frames): finer motion, 3.3 s per step on that CPU
    "small_p4": {"text": _TEXT, "transformer": {"patch_size": (1, 4, 4), **_WIDE}},
    # a few-thousand-parameter model for tests
    "tiny": {"text": {"d_model": 16, "d_ff": 32, "d_kv": 8, "num_heads": 2, "num_layers": 1},
             "transformer": {"patch_size": (1, 8, 8), "num_attention_heads": 2, "attention_head_dim": 8,
                             "ffn_dim": 32, "num_layers": 1}},
}


def default_asset_dir() -> Path:
    """flowrl/assets/toy_video/ inside the installed package (where a shipped teacher would live)."""
    return Path(str(resources.files("flowrl") / "assets" / "toy_video"))


def video_tokenizer():
    """Word-level tokenizer over the moving-shapes vocabulary (commas are words), padded to MAX_TOKENS."""
    from flowrl.data.video_shapes.grammar import vocabulary

    return build_tokenizer(vocabulary(), MAX_TOKENS)


def build_text_encoder(vocab_size: int, preset: str = "small"):
    """A randomly initialised UMT5EncoderModel of the preset's size."""
    from transformers import UMT5Config, UMT5EncoderModel

    cfg = UMT5Config(vocab_size=vocab_size, pad_token_id=SPECIAL_TOKENS["<pad>"], eos_token_id=SPECIAL_TOKENS["<eos>"],
                     decoder_start_token_id=0, relative_attention_num_buckets=16, relative_attention_max_distance=32,
                     dropout_rate=0.0, **PRESETS[preset]["text"])
    return UMT5EncoderModel(cfg).eval()


def build_transformer(text_encoder, preset: str = "small"):
    """A randomly initialised WanTransformer3DModel on 3-channel pixel videos attending to the text states."""
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(in_channels=3, out_channels=3, text_dim=text_encoder.config.d_model, freq_dim=256,
                                 cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=64,
                                 **PRESETS[preset]["transformer"])


def build_modules(preset: str = "small", seed: int = 0):
    """(tokenizer, text_encoder, transformer), freshly initialised from ``seed``."""
    if preset not in PRESETS:
        raise ValueError(f"unknown video toy preset {preset!r}; expected one of {sorted(PRESETS)}")
    torch.manual_seed(seed)
    tok = video_tokenizer()
    te = build_text_encoder(tok.get_vocab_size(), preset)
    return tok, te, build_transformer(te, preset)


def encode_text(text_encoder, ids: Tensor) -> Tensor:
    """Prompt embeddings (B, L, D): the encoder's last hidden states with padding masked and zeroed (as the
    Wan pipeline's ``_get_t5_prompt_embeds``)."""
    mask = (ids != SPECIAL_TOKENS["<pad>"]).long()
    out = text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    return out * mask.unsqueeze(-1).to(out.dtype)


def predict_velocity(transformer, x: Tensor, sigma: Tensor, embeds: Tensor) -> Tensor:
    """v_θ(x, σ, c) for pixel latents (B, 3, F, H, W), Wan's timestep convention t = 1000·σ."""
    t = (sigma.reshape(-1) * 1000.0).expand(x.shape[0]).to(x.dtype)
    return transformer(hidden_states=x, timestep=t, encoder_hidden_states=embeds, return_dict=False)[0]


def load_modules(directory: str | Path | None = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32):
    """(tokenizer, text_encoder, transformer) from a directory written by ``save_modules``, in eval mode."""
    from diffusers import WanTransformer3DModel
    from tokenizers import Tokenizer
    from transformers import UMT5EncoderModel

    d = Path(directory) if directory is not None else default_asset_dir()
    if not (d / "transformer" / "config.json").exists():
        raise FileNotFoundError(f"no video toy checkpoint in {d} (expected transformer/, text_encoder/, "
                                "tokenizer.json); pretrain one with scripts/pretrain_video_toy.py and pass its "
                                "<out>/checkpoint")
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    te = UMT5EncoderModel.from_pretrained(d / "text_encoder", dtype=dtype).to(device).eval()
    tr = WanTransformer3DModel.from_pretrained(d / "transformer", torch_dtype=dtype).to(device).eval()
    return tok, te, tr


__all__ = ["MAX_TOKENS", "PRESETS", "build_modules", "default_asset_dir", "encode_text", "load_modules",
           "predict_velocity", "save_modules", "tokenize", "video_tokenizer"]
