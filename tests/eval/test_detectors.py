"""Image statistics of flowrl.eval.detectors against hand-computed values, and the shapes-world ones against the
definitions they reuse (flowrl.data.shapes.detect, rewards/shapes.py's clean-background reward)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flowrl.eval import detectors as D


def constant(rgb, b=1, h=8, w=8):
    return torch.tensor(rgb, dtype=torch.float32).view(1, 3, 1, 1).expand(b, 3, h, w).clone()


def test_dark_and_bright_fractions_count_pixels_by_luma():
    img = constant([0.5, 0.5, 0.5], h=4, w=5)
    img[0, :, 0, :] = 0.0                           # 5 black pixels
    img[0, :, 1, :2] = 1.0                          # 2 white pixels
    img[0, :, 2, 0] = torch.tensor([0.0, 0.0, 0.6])  # luma 0.0433 < 0.05: dark although blue is 0.6
    img[0, :, 2, 1] = torch.tensor([0.0, 0.07, 0.0])  # luma 0.050: not below the threshold
    assert D.luma(img)[0, 2, 0].item() == pytest.approx(0.0722 * 0.6)
    assert D.dark_fraction(img).item() == pytest.approx(6 / 20)
    assert D.bright_fraction(img).item() == pytest.approx(2 / 20)
    assert D.dark_fraction(img, threshold=0.6).item() == pytest.approx(18 / 20)  # all but the white ones


def test_edge_density_of_a_step_edge_is_one_column_of_the_gradient_grid():
    """A vertical step of height a in every channel: ‖∇I‖ = a·sqrt(3) on the H−1 pixels left of the step, 0
    elsewhere, so density = (H−1)/((H−1)(W−1)) = 1/(W−1) when a·sqrt(3) > threshold."""
    h, w, col = 6, 9, 4
    img = constant([0.2, 0.2, 0.2], h=h, w=w)
    img[..., col:] += 0.1
    assert D.edge_density(img).item() == pytest.approx(1 / (w - 1))          # 0.173 > 0.1
    assert D.edge_density(img, threshold=0.1 * math.sqrt(3) + 1e-4).item() == 0.0
    checker = (torch.arange(h).view(h, 1) + torch.arange(w).view(1, w)) % 2
    assert D.edge_density(checker.float().expand(1, 3, h, w)).item() == 1.0
    assert D.edge_density(constant([0.3, 0.6, 0.9])).item() == 0.0
    assert D.edge_density(constant([0.3, 0.6, 0.9], h=1)).item() == 0.0     # no gradient grid at all


def test_color_entropy_closed_forms():
    assert D.color_entropy(constant([0.3, 0.6, 0.9])).item() == pytest.approx(0.0, abs=1e-6)
    half = constant([0.05, 0.05, 0.05])
    half[..., 4:] = 0.95
    assert D.color_entropy(half).item() == pytest.approx(1.0)
    quarter = constant([0.0, 0.0, 0.0])
    quarter[0, 0, :4, :4] = quarter[0, 1, 4:, :4] = quarter[0, 2, :4, 4:] = 1.0
    assert D.color_entropy(quarter).item() == pytest.approx(2.0)
    # every one of the 8³ quantised colours exactly once: log2(512) = 9 bits
    q = torch.arange(512)
    img = torch.stack([q // 64, (q // 8) % 8, q % 8]).float().add(0.5).div(8).view(1, 3, 16, 32)
    assert D.color_entropy(img).item() == pytest.approx(9.0)
    assert D.color_entropy(img, levels=2).item() == pytest.approx(3.0)       # 8 colours, 64 pixels each
    # against numpy on random colours (per-image histograms do not leak across the batch)
    rnd = torch.rand(3, 3, 10, 10, generator=torch.Generator().manual_seed(0))
    for b in range(3):
        codes = (rnd[b] * 8).floor().clamp(max=7).long()
        _, counts = np.unique((codes[0] * 64 + codes[1] * 8 + codes[2]).numpy(), return_counts=True)
        p = counts / counts.sum()
        assert D.color_entropy(rnd)[b].item() == pytest.approx(float(-(p * np.log2(p)).sum()), rel=1e-5)


def test_shapes_world_statistics_reuse_the_verifier_definitions():
    from flowrl.data.shapes import detect, sample_prompts
    from flowrl.data.shapes.render import render_batch
    from rewards.base import make_input
    from rewards.shapes import CleanBackgroundReward

    metas = [m for _, m in sample_prompts("heldout", 6, seed=1)]
    px = torch.as_tensor(render_batch(metas, 3))
    speckled = px.clone()
    speckled[:, :, 0:32:3, 0:32:5] = torch.tensor([0.5, 0.45, 0.1]).view(1, 3, 1, 1)  # off-palette dots
    for x in (px, speckled):
        stats = D.image_statistics(x, shapes_world=True)
        assert set(stats) == set(D.GENERIC_STATISTICS + D.SHAPES_STATISTICS)
        assert torch.equal(stats["palette_distance"], detect.palette_distance(x))
        clean = CleanBackgroundReward()(make_input(x, [""] * 6, torch.arange(6), metas))
        assert torch.equal(stats["stray_frac"] * 32 * 32, clean["stray_pixels"])
    assert D.stray_fraction(px).max().item() == 0.0                     # ground truth is clean
    assert D.stray_fraction(speckled).min().item() > 0.02
    assert set(D.image_statistics(px, shapes_world=False)) == set(D.GENERIC_STATISTICS)
    assert set(D.image_statistics(px, True, skip={"palette_distance"})) == {*D.GENERIC_STATISTICS, "stray_frac"}


def test_statistics_are_per_image_and_float32():
    imgs = torch.cat([constant([0.0, 0.0, 0.0]), constant([1.0, 1.0, 1.0]), constant([0.5, 0.2, 0.7])])
    stats = D.image_statistics(imgs.double(), shapes_world=False)
    assert stats["dark_frac"].tolist() == [1.0, 0.0, 0.0] and stats["bright_frac"].tolist() == [0.0, 1.0, 0.0]
    assert all(v.shape == (3,) and v.dtype == torch.float32 for v in stats.values())


def test_bad_input_is_explained():
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        D.image_statistics(torch.zeros(2, 4, 8, 8), shapes_world=False)
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        D.dark_fraction(torch.zeros(3, 8, 8))
    with pytest.raises(ValueError, match="levels must be >= 2"):
        D.color_entropy(constant([0.1, 0.1, 0.1]), levels=1)
