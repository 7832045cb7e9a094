"""Scene analysis of shapes-world pixels (pure torch): palette segmentation, connected components, shape
classification, stray pixels, and the palette-distance image-quality figure.

Pipeline for pixels P (B, 3, H, W) in [0, 1] and colours C_0 (background), C_1..C_5 (palette):

    d_k(p) = ‖P(p) − C_k‖₂,   label(p) = argmin_k d_k(p) if min_k d_k(p) < τ else "unknown",
    objects = 4-connected components of each palette label with area ≥ min_area,
    shape   = triangle if (ȳ − y_min)/(h − 1) > 0.58   (an upright triangle's centroid sits at ~2/3 height)
              else square if area/(h·w) ≥ 0.86          (a box fills its bounding box; a disc ≈ π/4)
              else circle.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from flowrl.data.shapes.world import COLORS, palette_rgb

TAU = 0.25            # max RGB distance of a pixel to its palette colour
MIN_AREA = 8          # smaller components are specks, not objects
TRIANGLE_CENTROID = 0.58
SQUARE_FILL = 0.86


@dataclass(frozen=True)
class Detected:
    """One detected object: palette colour, shape class, centroid (x, y) in px, area and shape features."""

    color: str
    shape: str
    cx: float
    cy: float
    area: int
    fill: float
    centroid_height: float


def _colors(device) -> Tensor:
    return torch.tensor(palette_rgb(), dtype=torch.float32, device=device)


def palette_distances(pixels: Tensor) -> Tensor:
    """d_k(p) (B, 1 + n_colors, H, W): RGB distance of each pixel to the background and each palette colour."""
    if pixels.dim() != 4 or pixels.shape[1] != 3:
        raise ValueError(f"shapes-world pixels must be (B, 3, H, W), got {tuple(pixels.shape)}")
    c = _colors(pixels.device)
    diff = pixels.float().unsqueeze(1) - c[None, :, :, None, None]
    return diff.square().sum(dim=2).sqrt()


def palette_distance(pixels: Tensor) -> Tensor:
    """Image-quality figure (B,): mean over pixels of min_k d_k(p), the distance to the nearest
    background/palette colour (0 for a clean render up to shade jitter; grows with blur and speckle). Videos
    (B, F, 3, H, W): the mean over their frames."""
    if pixels.dim() == 5:
        return palette_distance(pixels.reshape(-1, *pixels.shape[2:])).view(pixels.shape[:2]).mean(1)
    return palette_distances(pixels).min(dim=1).values.flatten(1).mean(1)


def segment(pixels: Tensor, tau: float = TAU) -> Tensor:
    """Label map (B, H, W) int64: 0 background, 1..5 palette colour (COLORS order), −1 unknown."""
    d = palette_distances(pixels)
    dmin, k = d.min(dim=1)
    return torch.where(dmin < tau, k, torch.full_like(k, -1))


def _shift_max(lab: Tensor) -> Tensor:
    """max of each pixel's label and its 4 neighbours'."""
    p = F.pad(lab, (1, 1, 1, 1))
    out = torch.maximum(lab, p[..., :-2, 1:-1])
    for nb in (p[..., 2:, 1:-1], p[..., 1:-1, :-2], p[..., 1:-1, 2:]):
        out = torch.maximum(out, nb)
    return out


def connected_components(mask: Tensor) -> Tensor:
    """4-connected component ids (N, H, W) int64 of a boolean mask (N, H, W): 0 off the mask, and one id
    (the largest flat pixel index + 1 in the component) per component, by max-label propagation."""
    n, h, w = mask.shape
    lab = torch.arange(1, n * h * w + 1, device=mask.device).view(n, h, w) * mask
    while True:
        nxt = _shift_max(lab) * mask
        if torch.equal(nxt, lab):
            return lab
        lab = nxt


def _palette_components(pixels: Tensor, tau: float) -> tuple[Tensor, Tensor]:
    """(segment (B, H, W), component ids (B·n_colors, H, W)) with plane b·n_colors + k holding colour k+1;
    propagation runs only on the planes that contain that colour."""
    b, _, h, w = pixels.shape
    seg = segment(pixels, tau)
    k = len(COLORS)
    masks = torch.stack([seg == i + 1 for i in range(k)], dim=1).view(b * k, h, w)
    comp = torch.zeros(masks.shape, dtype=torch.long, device=pixels.device)
    live = masks.flatten(1).any(1).nonzero().squeeze(1)
    if len(live):
        sub = connected_components(masks[live])
        offset = (live * h * w).view(-1, 1, 1) - (torch.arange(len(live), device=live.device) * h * w).view(-1, 1, 1)
        comp[live] = torch.where(sub > 0, sub + offset, sub)
    return seg, comp


def _classify(centroid_height: float, fill: float) -> str:
    if centroid_height > TRIANGLE_CENTROID:
        return "triangle"
    return "square" if fill >= SQUARE_FILL else "circle"


def _component_stats(comp: Tensor) -> tuple[Tensor, ...]:
    """(ids, area, cy, cx, ymin, ymax, xmin, xmax) of every component id > 0 in ``comp`` (N, H, W)."""
    n, h, w = comp.shape
    on = comp.flatten() > 0
    ids, inv = torch.unique(comp.flatten()[on], return_inverse=True)
    ys = torch.arange(h, device=comp.device).view(1, h, 1).expand(n, h, w).flatten()[on].float()
    xs = torch.arange(w, device=comp.device).view(1, 1, w).expand(n, h, w).flatten()[on].float()
    m = len(ids)
    area = torch.zeros(m, device=comp.device).index_add_(0, inv, torch.ones_like(ys))

    def red(v, how):
        init = torch.full((m,), float("inf") if how == "amin" else -float("inf"), device=comp.device)
        return init.scatter_reduce(0, inv, v, reduce=how)

    cy = torch.zeros(m, device=comp.device).index_add_(0, inv, ys) / area
    cx = torch.zeros(m, device=comp.device).index_add_(0, inv, xs) / area
    return ids, area, cy, cx, red(ys, "amin"), red(ys, "amax"), red(xs, "amin"), red(xs, "amax")


def detect(pixels: Tensor, tau: float = TAU, min_area: int = MIN_AREA) -> list[list[Detected]]:
    """The objects of each image: B lists of Detected, ordered by (colour, first pixel)."""
    b, _, h, w = pixels.shape
    k = len(COLORS)
    comp = _palette_components(pixels, tau)[1]
    ids, area, cy, cx, y0, y1, x0, x1 = (t.tolist() for t in _component_stats(comp))
    out: list[list[Detected]] = [[] for _ in range(b)]
    for i, cid in enumerate(ids):
        if area[i] < min_area:
            continue
        plane = (cid - 1) // (h * w)
        bh, bw = y1[i] - y0[i] + 1, x1[i] - x0[i] + 1
        fill = area[i] / (bh * bw)
        ch = (cy[i] - y0[i]) / max(bh - 1, 1)
        out[plane // k].append(Detected(COLORS[plane % k], _classify(ch, fill), cx[i], cy[i], int(area[i]),
                                        fill, ch))
    return out


def stray_pixels(pixels: Tensor, tau: float = TAU, min_area: int = MIN_AREA) -> Tensor:
    """Count (B,) of pixels that are neither background nor within 1 px of an object component
    (specks, faint colour, unknown colours): what the clean-background reward penalises."""
    b, _, h, w = pixels.shape
    k = len(COLORS)
    seg, comp = _palette_components(pixels, tau)
    ids, area = _component_stats(comp)[:2]
    big = ids[area >= min_area]
    obj = torch.isin(comp, big).view(b, k, h, w).any(1).float()
    near_obj = F.max_pool2d(obj.unsqueeze(1), 3, stride=1, padding=1).squeeze(1) > 0
    return ((seg != 0) & ~near_obj).flatten(1).sum(1)
