"""Per-sample sizes a run's config implies: transformer tokens and width, latent, text-conditioning, pixel elements.

    tokens = image tokens + text tokens;  image tokens: (H/f/p)(W/f/p) (SD3, toy), (H/2f)(W/2f) (FLUX packing),
             F'·(H/f/p)(W/f/p) with F' = (F − 1)/4 + 1 (Wan);   text: 77 + max_sequence_length (SD3), 16 (toy),
             max_sequence_length (FLUX, Wan);   width D = heads × head_dim
LTX-2: video F'·H'·W' with F' = (F − 1)/8 + 1 (×32 space; the tiny preset ×2 in both) + audio
L = round(F / fps · sr / hop / 4) (16 kHz, hop 160: 25 latents a second), text max_sequence_length;
latent C·F'·H'·W' + C_a·L (C_a = audio_in_channels, the packed channels × mel bins); conditioning: video and audio
connector embeddings, caption_channels wide each.
f is the VAE factor (8; the tiny SD3 / FLUX presets 1, the toy works in pixels: 1), p the transformer patch.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Geometry:
    """One sample's sizes (elements, tokens)."""

    image_tokens: int
    text_tokens: int
    width: int                  # D = num_attention_heads × attention_head_dim
    latent: int                 # latent elements per sample
    cond: int                   # text-conditioning elements per sample (embeddings + pooled)
    pixels: int                 # decoded pixel elements per sample
    audio_tokens: int = 0       # LTX-2's audio stream (its own, narrower width; counted at D, an upper bound)

    @property
    def tokens(self) -> int:
        return self.image_tokens + self.text_tokens + self.audio_tokens


LTX2_AUDIO_PER_SECOND = 16000 / 160 / 4     # LTX-2 audio latents per second (sample rate / hop / ×4 time)


def vae_factor(family: str, tiny: bool) -> int:
    if family == "ltx2":
        return 2 if tiny else 32
    if family == "hunyuan15":
        return 4 if tiny else 16
    if family == "wan22_ti2v":
        return 16
    return 1 if family == "toy" or (tiny and family in ("sd3", "flux")) else 8


def geometry(family: str, tcfg: dict, tiny: bool, height: int, width: int, frames: int | None,
             max_sequence_length: int | None, frame_rate: float = 24.0) -> Geometry:
    """The sizes of one sample of ``family`` at H × W (× F frames) for transformer config ``tcfg``."""
    f = vae_factor(family, tiny)
    d = tcfg["num_attention_heads"] * tcfg["attention_head_dim"]
    h, w = height // f, width // f
    if family == "ltx2":
        p, pt = tcfg["patch_size"], tcfg["patch_size_t"]
        ft = (frames - 1) // (2 if tiny else 8) + 1
        audio = round(frames / frame_rate * LTX2_AUDIO_PER_SECOND)
        img = (ft // pt) * (h // p) * (w // p)
        latent = tcfg["in_channels"] * ft * h * w + tcfg["audio_in_channels"] * audio
        cond = max_sequence_length * (2 * tcfg["caption_channels"] + 1)      # video, audio embeddings + the mask
        return Geometry(img, max_sequence_length, d, latent, cond, 3 * frames * height * width, audio)
    if family == "hunyuan15":         # context: 729 image tokens (zeros for T2V) + 256 ByT5 + the Qwen tokens
        ft = (frames - 1) // (2 if tiny else 4) + 1
        img, text = ft * h * w, max_sequence_length + 256 + 729
        cond = max_sequence_length * tcfg["text_embed_dim"] + 256 * tcfg["text_embed_2_dim"]
        return Geometry(img, text, d, tcfg["out_channels"] * ft * h * w, cond, 3 * frames * height * width)
    if family.startswith("wan"):
        p = tcfg["patch_size"]
        ft = (frames - 1) // 4 + 1
        img = ft * (h // p[1]) * (w // p[2])
        latent = tcfg["out_channels"] * ft * h * w         # I2V's extra input channels are recomputed
        text = max_sequence_length
        cond = text * tcfg["text_dim"]
        return Geometry(img, text, d, latent, cond, 3 * frames * height * width)
    if family == "flux":
        img, latent, text = (h // 2) * (w // 2), tcfg["in_channels"] // 4 * h * w, max_sequence_length
    else:
        p = tcfg["patch_size"]
        img, latent = (h // p) * (w // p), tcfg["in_channels"] * h * w
        text = 16 if family == "toy" else 77 + max_sequence_length
    cond = text * tcfg["joint_attention_dim"] + tcfg["pooled_projection_dim"]
    return Geometry(img, text, d, latent, cond, 3 * height * width)
