"""LTX-2 image-to-video: the first frame as ``LTX2ImageToVideoPipeline`` (``pipeline_ltx2_image2video.py``) conditions.

Pipeline: the image (H.264 re-compressed at ``image_crf``: 33 for Gemma 3 checkpoints, ``resolve_default_image_crf``;
0 skips) is preprocessed to [−1, 1] at H × W, encoded by the video VAE as a one-frame video (latent mode),
normalised ``(z − mean)/std`` (``prepare_latents``) and written into latent frame 0; its conditioning mask
κ = 1 on frame 0. Each step the transformer sees the video timestep per token ``t·(1 − κ)`` (0 on the clean
frame; audio and σ keep t), the guidance runs on all tokens, and only frames 1: are stepped, so frame 0 stays c.

flowrl keeps the joint row ``x`` (ltx2.py) and, as for Wan2.2 TI2V (wan22.py), feeds the transformer
``x_in = κ·c + (1 − κ)·x``, returns the pipeline's velocity on the noisy tokens and on the clean frame the exact
velocity of a known x₀, ``v = (x − c)/σ``:

    v = (1 − κ)·v_pipe(x_in) + κ·(x − c)/σ

so every ODE step keeps frame 0 on the straight path to c (it equals c at σ = 0), and ``x_in`` equals the
pipeline's latents at every step. Rows without an image (``has_image`` 0) are text-to-video rows (κ = 0).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from flowrl.types import Cond, attach_first_frames


def store_first_frames(policy, cond: Cond, images: Sequence | None, batch: int) -> Cond:
    """``encode``'s images → ``cond.embeds["image"]`` (B, 3, H, W) in [0, 1] and ``"has_image"`` (B,) 0/1: each row's
    first image (rows without one get zeros and 0)."""
    rows = policy.check_images(images, batch)
    if rows is None:
        return cond
    firsts = [row[0] if row else None for row in rows]
    shapes = {tuple(f.shape) for f in firsts if f is not None}
    if len(shapes) > 1:
        raise ValueError(f"LTX-2 first frames must share one size per batch, got {sorted(shapes)}")
    return attach_first_frames(cond, firsts, policy.device)


def recompress(pipe, images: Tensor, crf: int | None) -> Tensor:
    """(B, 3, H, W) [0, 1] → the same after the pipeline's H.264 round trip at ``crf`` (None → the checkpoint's
    default; 0 → unchanged), through uint8 as the pipeline's PIL path: ``apply_image_conditioning_crf``."""
    import numpy as np
    from diffusers.pipelines.ltx2 import pipeline_ltx2_image2video as i2v

    crf = i2v.resolve_default_image_crf(pipe.text_encoder) if crf is None else crf
    if crf == 0:
        return images
    out = []
    for img in images:
        u8 = (img.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
        back = np.ascontiguousarray(i2v.apply_image_conditioning_crf(u8, crf))
        out.append(torch.from_numpy(back).permute(2, 0, 1).float() / 255)
    return torch.stack(out).to(images.device)


def i2v_pipe(policy):
    """``LTX2ImageToVideoPipeline`` on the policy's own components (built once)."""
    import inspect

    from diffusers import LTX2ImageToVideoPipeline

    if getattr(policy, "_i2v", None) is None:
        names = set(inspect.signature(LTX2ImageToVideoPipeline.__init__).parameters)
        policy._i2v = LTX2ImageToVideoPipeline(**{k: v for k, v in policy.pipe.components.items() if k in names})
    return policy._i2v


@torch.no_grad()
def first_frame_latents(policy, video: Tensor, cond: Cond) -> Tensor:
    """c (B, C, 1, H', W'): each row's image through the I2V pipeline's ``prepare_latents`` at the size of ``video``
    (B, C, F', H', W'), cached in ``cond.embeds["image_latents"]``."""
    cached = cond.embeds.get("image_latents")
    if cached is not None and cached.shape[0] == video.shape[0] and cached.shape[3:] == video.shape[3:]:
        return cached
    pipe = i2v_pipe(policy)
    fs, ft = pipe.vae_spatial_compression_ratio, pipe.vae_temporal_compression_ratio
    b, ch, f, h, w = video.shape
    pixels = recompress(pipe, cond.embeds["image"], policy.config.image_crf)
    pixels = pipe.video_processor.preprocess(pixels, height=h * fs, width=w * fs)
    pixels = pixels.to(video.device, pipe.vae.dtype)
    g = torch.Generator(video.device).manual_seed(0)          # prepare_latents draws noise for frames 1: (unused)
    packed, _ = pipe.prepare_latents(pixels, b, ch, h * fs, w * fs, (f - 1) * ft + 1, 0.0, torch.float32,
                                     video.device, [g] * b, None)
    full = pipe._unpack_latents(packed, f, h, w, pipe.transformer_spatial_patch_size,
                                pipe.transformer_temporal_patch_size)
    cond.embeds["image_latents"] = full[:, :, :1].contiguous()
    return cond.embeds["image_latents"]


def conditioning(policy, x: Tensor, cond: Cond) -> tuple[Tensor, Tensor, Tensor] | None:
    """(c, κ in the joint row layout (B, N), κ as the pipeline's video mask (B, 1, F', H', W')), or None without
    images: c holds the first-frame latents on image rows' frame 0 (zeros elsewhere), κ = 1 there."""
    if "image" not in cond.embeds:
        return None
    video, audio = policy.split(x)
    c0 = first_frame_latents(policy, video, cond).to(x.device)
    has = cond.embeds["has_image"].to(x.device).view(-1, 1, 1, 1, 1)
    mask = torch.zeros(video.shape[0], 1, *video.shape[2:], device=x.device)
    mask[:, :, :1] = has
    c = torch.zeros_like(video)
    c[:, :, :1] = c0 * has
    row = policy.join(mask.expand_as(video), torch.zeros_like(audio))
    return policy.join(c, torch.zeros_like(audio)), row, mask


def image_velocity(policy, x: Tensor, sigma: Tensor, cond: Cond, guidance: float | None) -> Tensor:
    """v (B, N) float32 with first-frame conditioning (module docstring); plain ``guided_velocity`` without images."""
    from flowrl.policies.ltx2_guidance import guided_velocity

    parts = conditioning(policy, x, cond)
    if parts is None:
        return guided_velocity(policy, x, sigma, cond, guidance)
    c, kappa, mask = parts
    x_in = kappa * c + (1 - kappa) * x
    v = guided_velocity(policy, x_in, sigma, cond, guidance, video_mask=mask)
    return (1 - kappa) * v + kappa * (x - c) / sigma.clamp_min(1e-6).view(-1, 1)
