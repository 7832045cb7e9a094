"""Seed diversity (flowrl.eval.diversity) on hand-made cases with closed forms."""
from __future__ import annotations

import math

import pytest
import torch

from flowrl.eval.diversity import downsample, pairwise_rms, prompt_diversity, seed_diversity


def constant(rgb, h=8, w=8):
    return torch.tensor(rgb, dtype=torch.float32).view(3, 1, 1).expand(3, h, w)


def test_identical_samples_have_zero_diversity():
    x = torch.rand(3, 16, 16, generator=torch.Generator().manual_seed(0))
    imgs = torch.stack([x, x, x, x * 0.5, x * 0.5])
    assert prompt_diversity(imgs, [0, 0, 0, 1, 1]) == {0: pytest.approx(0.0, abs=1e-6), 1: pytest.approx(0.0, abs=1e-6)}
    assert seed_diversity(imgs, [0, 0, 0, 1, 1]) == pytest.approx(0.0, abs=1e-6)


def test_two_constant_images_closed_form():
    """RMS(a − b) over channels and pixels = sqrt(mean_c (a_c − b_c)²), at any resolution and downsampling."""
    a, b = [0.1, 0.5, 0.9], [0.4, 0.5, 0.1]
    expected = math.sqrt(((0.3) ** 2 + 0 + 0.8 ** 2) / 3)
    for h, w, size in [(8, 8, 64), (130, 70, 64), (130, 70, None), (5, 3, 2)]:
        imgs = torch.stack([constant(a, h, w), constant(b, h, w)])
        assert seed_diversity(imgs, [7, 7], size=size) == pytest.approx(expected, rel=1e-5)


def test_mean_over_pairs_then_over_prompts():
    """Prompt 0: three grey levels 0, 0.3, 0.9 → pairs 0.3, 0.9, 0.6 → 0.6; prompt 1: 0.2 and 0.7 → 0.5;
    prompt 2 has one sample (no pairs) and is left out."""
    levels = [0.0, 0.3, 0.9, 0.2, 0.7, 0.4]
    imgs = torch.stack([constant([v] * 3) for v in levels])
    ids = torch.tensor([0, 0, 0, 1, 1, 2])
    per_prompt = prompt_diversity(imgs, ids)
    assert per_prompt == {0: pytest.approx(0.6), 1: pytest.approx(0.5)}
    assert seed_diversity(imgs, ids) == pytest.approx(0.55)
    assert math.isnan(seed_diversity(imgs[:1], [0]))


def test_pairwise_rms_matches_direct_computation_and_video_frames():
    x = torch.rand(4, 2, 3, 5, 6, generator=torch.Generator().manual_seed(1))   # (S, F, C, H, W)
    d = pairwise_rms(x)
    for i in range(4):
        for j in range(4):
            assert d[i, j].item() == pytest.approx((x[i] - x[j]).square().mean().sqrt().item(), abs=1e-6)
    assert prompt_diversity(x, [0, 0, 0, 0])[0] == pytest.approx(d[torch.triu_indices(4, 4, 1).unbind()].mean().item())


def test_downsampling_averages_away_independent_pixel_noise():
    """Per-pixel noise of std s raises full-resolution RMS by ≈ s·sqrt(2) but 8×8 area means by s·sqrt(2)/8."""
    g = torch.Generator().manual_seed(2)
    base = torch.full((2, 3, 64, 64), 0.5)
    noisy = base + 0.1 * torch.randn(base.shape, generator=g)
    full = seed_diversity(noisy, [0, 0], size=None)
    small = seed_diversity(noisy, [0, 0], size=8)
    assert full == pytest.approx(0.1 * math.sqrt(2), rel=0.05)
    assert small == pytest.approx(0.1 * math.sqrt(2) / 8, rel=0.15)
    assert downsample(noisy, 8).shape == (2, 3, 8, 8) and torch.equal(downsample(noisy, None), noisy)
    assert downsample(torch.zeros(1, 3, 100, 50), 64).shape == (1, 3, 64, 32)


def test_bad_input_is_explained():
    with pytest.raises(ValueError, match="prompt_ids has 3 entries for 2 images"):
        seed_diversity(torch.zeros(2, 3, 4, 4), [0, 0, 1])
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        seed_diversity(torch.zeros(3, 4, 4), [0, 0, 1])
    with pytest.raises(ValueError, match="size must be >= 1"):
        downsample(torch.zeros(1, 3, 4, 4), 0)
