"""Advantages against hand-computed values (flow_grpo ``stat_tracking.py``, MC-GRPO, BranchGRPO)."""
import math

import numpy as np
import pytest
import torch

from flowrl.balancers.advantages import (
    batch_normalize,
    clip_advantages,
    group_advantages,
    group_stats,
    median_advantages,
    zero_std_mask,
    zero_std_ratio,
)

NAN = float("nan")


def test_group_mean_global_std_by_hand():
    r = torch.tensor([1.0, 3.0, 10.0, 14.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 1, 1])
    s = np.std([1, 3, 10, 14])  # population std, as numpy / Flow-GRPO
    want = torch.tensor([-1.0, 1.0, -2.0, 2.0], dtype=torch.float64) / (s + 1e-4)
    torch.testing.assert_close(group_advantages(r, g, std="global"), want)


def test_group_std_and_none_by_hand():
    r = torch.tensor([1.0, 3.0, 10.0, 14.0], dtype=torch.float64)
    g = torch.tensor([5, 5, 2, 2])  # arbitrary ids
    want = torch.tensor([-1 / (1 + 1e-4), 1 / (1 + 1e-4), -2 / (2 + 1e-4), 2 / (2 + 1e-4)], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(r, g, std="group"), want)
    torch.testing.assert_close(group_advantages(r, g, std="none"), torch.tensor([-1.0, 1, -2, 2], dtype=torch.float64))
    unb = group_advantages(r, g, std="group", unbiased=True)
    assert unb[0] == pytest.approx(-1 / (math.sqrt(2) + 1e-4))


def test_interleaved_groups_and_clip():
    r = torch.tensor([0.0, 100.0, 1.0, 0.0])
    g = torch.tensor([0, 1, 0, 1])
    a = group_advantages(r, g, std="none", clip=5.0)
    torch.testing.assert_close(a, torch.tensor([-0.5, 5.0, 0.5, -5.0]))
    with pytest.raises(ValueError, match="clip"):
        clip_advantages(a, 0.0)


def test_nan_rewards_excluded_from_stats():
    r = torch.tensor([1.0, NAN, 3.0, 5.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 1])
    a = group_advantages(r, g, std="global")
    s = np.std([1, 3, 5])
    assert math.isnan(a[1])
    torch.testing.assert_close(a[[0, 2, 3]], torch.tensor([-1.0, 1.0, 0.0], dtype=torch.float64) / (s + 1e-4))
    _, _, cnt = group_stats(r, g)
    assert cnt.tolist() == [2, 2, 2, 1]


def test_all_nan_group_gives_nan():
    r = torch.tensor([NAN, NAN, 1.0, 2.0])
    a = group_advantages(r, torch.tensor([0, 0, 1, 1]), std="group")
    assert torch.isnan(a[:2]).all() and torch.isfinite(a[2:]).all()


def test_zero_std_filtering():
    r = torch.tensor([1.0, 1.0, 0.0, 2.0, 7.0, NAN])
    g = torch.tensor([0, 0, 1, 1, 2, 2])  # group 2 has one finite reward → no spread
    assert zero_std_mask(r, g).tolist() == [False, False, True, True, False, False]
    assert zero_std_ratio(r, g) == pytest.approx(2 / 3)


def test_bad_input_errors():
    with pytest.raises(ValueError, match="group_ids shape"):
        group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        group_advantages(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="std must be"):
        group_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), std="bogus")


def test_batch_normalize_unbiased():
    x = torch.tensor([1.0, 2.0, 3.0, NAN], dtype=torch.float64)
    torch.testing.assert_close(batch_normalize(x, eps=0.0)[:3], torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64))


def test_mc_grpo_median_by_hand():
    # G+1 = 5 rollouts: median 3 (index 2), |r−m| = [2,1,0,1,7] → MAD = 1 (+1e-3)
    r = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0])
    a, keep = median_advantages(r, torch.zeros(5, dtype=torch.long), compensate=False)
    torch.testing.assert_close(a, torch.tensor([-2.0, -1.0, 0.0, 1.0, 7.0]) / 1.001)
    assert keep.tolist() == [True, True, False, True, True]
    a2, _ = median_advantages(r, torch.zeros(5, dtype=torch.long))
    torch.testing.assert_close(a2, a * 5 / 4)  # 4 nonzero of 5


def test_mc_grpo_two_groups_and_nan():
    r = torch.tensor([5.0, 0.0, NAN, 1.0, 9.0, 2.0, 4.0])
    g = torch.tensor([0, 1, 0, 0, 1, 1, 0])
    a, keep = median_advantages(r, g, compensate=False)
    # group 0 finite {5,1,4}: median 4, MAD median{1,3,0}=1; group 1 {0,9,2}: median 2, MAD median{2,7,0}=2
    want = torch.tensor([1 / 1.001, -2 / 2.001, NAN, -3 / 1.001, 7 / 2.001, 0.0, 0.0])
    torch.testing.assert_close(a, want, equal_nan=True)
    assert keep.tolist() == [True, True, False, True, True, False, False]
