"""Per-image statistics that expose reward hacking: darkening, blow-out, speckle, blur, colour collapse, and (in
the shapes world) off-palette colour and stray pixels.

Images are (B, 3, H, W) in [0, 1]; every function returns one value per image (B,). They are what UniRL PR #407
tracked on a hacked OCR Flow-GRPO run (dark-pixel fraction 0.451 → 0.926, edge density −60 %, colour entropy
−54 %; UniRL PR #407), plus the shapes world's own figures (docs/shapes.md). With L = 0.2126 R + 0.7152 G
+ 0.0722 B (Rec. 709 weights on the stored, gamma-encoded values):

    dark_frac     = mean_p [L(p) < 0.05]                      near-black pixels
    bright_frac   = mean_p [L(p) > 0.95]                      near-white (blown-out) pixels
    edge_density  = mean_p [‖∇I(p)‖ > 0.1],  ‖∇I‖² = Σ_c (I_c(y, x+1) − I_c(y, x))² + (I_c(y+1, x) − I_c(y, x))²
                    on the (H−1)×(W−1) grid of forward differences
    color_entropy = −Σ_k q_k log2 q_k  (bits) of the histogram of colours quantised to 8 levels per channel
                    (512 bins; 0 for a flat image, at most min(9, log2(H·W)))
    palette_distance (shapes world) = flowrl.data.shapes.detect.palette_distance
    stray_frac       (shapes world) = detect.stray_pixels / (H·W), the pixels rewards/shapes.py's
                    CleanBackgroundReward penalises (neither background nor within 1 px of an object)

All are computed on the full-resolution pixels and compare only across images of the same resolution.
"""
from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor

__all__ = [
    "BRIGHT_LUMA", "DARK_LUMA", "EDGE_THRESHOLD", "ENTROPY_LEVELS", "GENERIC_STATISTICS", "SHAPES_STATISTICS",
    "bright_fraction", "color_entropy", "dark_fraction", "edge_density", "image_statistics", "luma",
    "shapes_palette_distance", "stray_fraction",
]

DARK_LUMA = 0.05        # luma below this is near black (8-bit ≤ 12)
BRIGHT_LUMA = 0.95      # luma above this is near white (8-bit ≥ 243)
EDGE_THRESHOLD = 0.1    # RGB gradient magnitude of an edge pixel (a 0.1 step in one channel, ~26/255)
ENTROPY_LEVELS = 8      # quantisation levels per channel for the colour histogram (8³ = 512 colours)
_REC709 = (0.2126, 0.7152, 0.0722)

GENERIC_STATISTICS = ("dark_frac", "bright_frac", "edge_density", "color_entropy")
SHAPES_STATISTICS = ("palette_distance", "stray_frac")


def _check(images: Tensor) -> Tensor:
    if not isinstance(images, Tensor) or images.dim() != 4 or images.shape[1] != 3:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images must be a (B, 3, H, W) tensor in [0, 1], got {shape}")
    return images.float()


def luma(images: Tensor) -> Tensor:
    """L = 0.2126 R + 0.7152 G + 0.0722 B (Rec. 709), (B, H, W)."""
    x = _check(images)
    w = torch.tensor(_REC709, device=x.device, dtype=x.dtype)
    return torch.einsum("bchw,c->bhw", x, w)


def dark_fraction(images: Tensor, threshold: float = DARK_LUMA) -> Tensor:
    """Fraction (B,) of pixels with luma < threshold."""
    return (luma(images) < threshold).flatten(1).float().mean(1)


def bright_fraction(images: Tensor, threshold: float = BRIGHT_LUMA) -> Tensor:
    """Fraction (B,) of pixels with luma > threshold."""
    return (luma(images) > threshold).flatten(1).float().mean(1)


def edge_density(images: Tensor, threshold: float = EDGE_THRESHOLD) -> Tensor:
    """Fraction (B,) of the (H−1)×(W−1) forward-difference grid where ‖∇I‖ > threshold, with
    ‖∇I‖² = Σ_c (∂x I_c)² + (∂y I_c)²; 0 for an image with fewer than 2 rows or columns."""
    x = _check(images)
    if x.shape[-1] < 2 or x.shape[-2] < 2:
        return torch.zeros(x.shape[0], device=x.device)
    corner = x[..., :-1, :-1]
    dx = x[..., :-1, 1:] - corner
    dy = x[..., 1:, :-1] - corner
    grad_sq = (dx.square() + dy.square()).sum(1)
    return (grad_sq > threshold ** 2).flatten(1).float().mean(1)


def color_entropy(images: Tensor, levels: int = ENTROPY_LEVELS) -> Tensor:
    """Entropy (B,) in bits of the histogram of colours quantised to ``levels`` per channel:
    q(p) = min(⌊levels·I_c(p)⌋, levels − 1), H = −Σ_k q_k log2 q_k over the levels³ bins."""
    if levels < 2:
        raise ValueError(f"color_entropy: levels must be >= 2, got {levels}")
    x = _check(images)
    b = x.shape[0]
    q = (x * levels).floor().clamp(0, levels - 1).long()
    code = (q[:, 0] * levels + q[:, 1]) * levels + q[:, 2]                    # (B, H, W) in [0, levels³)
    bins = levels ** 3
    offset = torch.arange(b, device=x.device).view(b, 1, 1) * bins
    counts = torch.bincount((code + offset).flatten(), minlength=b * bins).view(b, bins).float()
    p = counts / counts.sum(1, keepdim=True)
    return -(p * torch.log2(p.clamp(min=1e-30))).sum(1)


def shapes_palette_distance(images: Tensor) -> Tensor:
    """Mean distance (B,) of each pixel to its nearest background/palette colour (the shapes world's
    image-quality figure, ``flowrl.data.shapes.detect.palette_distance``)."""
    from flowrl.data.shapes.detect import palette_distance

    return palette_distance(_check(images))


def stray_fraction(images: Tensor) -> Tensor:
    """Fraction (B,) of pixels that are neither background nor within 1 px of an object: the count behind
    rewards/shapes.py's CleanBackgroundReward (``detect.stray_pixels``, default τ and min area) over H·W."""
    from flowrl.data.shapes.detect import stray_pixels

    x = _check(images)
    return stray_pixels(x).float() / (x.shape[-1] * x.shape[-2])


_FUNCTIONS = {"dark_frac": dark_fraction, "bright_frac": bright_fraction, "edge_density": edge_density,
              "color_entropy": color_entropy, "palette_distance": shapes_palette_distance,
              "stray_frac": stray_fraction}


@torch.no_grad()
def image_statistics(images: Tensor, shapes_world: bool, *, skip: Collection[str] = ()) -> dict[str, Tensor]:
    """{statistic: (B,) float32 on the images' device} for a batch (B, 3, H, W) in [0, 1]: the generic
    statistics, plus ``palette_distance`` and ``stray_frac`` when ``shapes_world``; names in ``skip`` are left
    out (e.g. a figure another scorer already computes)."""
    x = _check(images).detach()
    names = GENERIC_STATISTICS + (SHAPES_STATISTICS if shapes_world else ())
    return {n: _FUNCTIONS[n](x).float() for n in names if n not in skip}
