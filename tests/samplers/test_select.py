"""Candidate-pool selectors against brute-force definitions, τ-b against scipy, hit rate and contrast by hand."""
import itertools
import math
from fractions import Fraction

import pytest
import torch

from samplers.select import (
    SELECTORS,
    best_worst,
    extremes_random,
    kendall_tau_b,
    max_variance,
    mean_deviation,
    random,
    select,
    selected_contrast,
    top_bottom_hit_rate,
)


def ranking(s):
    """The documented total order, in plain Python: score descending, then index ascending."""
    return sorted(range(len(s)), key=lambda i: (-s[i], i))


def gen(seed):
    return torch.Generator().manual_seed(seed)


def exact_var(values):
    vals = [Fraction(v) for v in values]
    m = sum(vals) / len(vals)
    return sum((v - m) ** 2 for v in vals) / len(vals)


def small_cases(seed=0, n_cases=40):
    """Score rows with many ties (integers 0..4) and without (floats), N in 1..9."""
    g = torch.Generator().manual_seed(seed)
    for c in range(n_cases):
        n = 1 + c % 9
        if c % 2:
            yield torch.randint(0, 5, (n,), generator=g).double()
        else:
            yield torch.randn(n, generator=g, dtype=torch.float64)


def test_best_worst_is_top_half_and_bottom_half_of_the_ranking():
    for s in small_cases():
        order = ranking(s.tolist())
        for k in range(1, len(s) + 1):
            want = sorted(order[:k // 2] + order[len(s) - (k - k // 2):])
            got = best_worst(s, k)
            assert got.tolist() == want
            assert len(set(got.tolist())) == k                  # disjoint halves even with ties


def test_best_worst_matches_sol_rl_topk_union_when_scores_are_distinct():
    s = torch.randn(96, generator=gen(3))
    want = torch.cat([torch.topk(s, 12).indices, torch.topk(s, 12, largest=False).indices]).sort().values
    assert torch.equal(best_worst(s, 24), want)


def test_ties_go_to_the_lower_index_on_top():
    s = torch.tensor([1.0, 1.0, 1.0, 1.0])
    assert best_worst(s, 2).tolist() == [0, 3]                  # top 1 = index 0, bottom 1 = index 3
    assert mean_deviation(s, 2).tolist() == [0, 1]


def test_mean_deviation_is_the_k_farthest_from_the_mean():
    for s in small_cases(seed=1):
        vals = [Fraction(v) for v in s.tolist()]                # exact mean; floats are dyadic
        m = sum(vals) / len(vals)
        dev = [abs(v - m) for v in vals]
        order = sorted(range(len(s)), key=lambda i: (-dev[i], i))
        for k in range(1, len(s) + 1):
            got = mean_deviation(s, k).tolist()
            # exact ties may be resolved by float64 round-off; the kept set must still be a top-k by deviation
            assert min(dev[i] for i in got) >= max((dev[i] for i in order[k:]), default=-1)
            if len(set(dev)) == len(dev):
                assert got == sorted(order[:k])


def test_mean_deviation_exact_ties_use_index_order():
    s = torch.tensor([0.0, 4.0, 1.0, 3.0])                      # mean 2: deviations 2, 2, 1, 1 exactly
    assert mean_deviation(s, 1).tolist() == [0]
    assert mean_deviation(s, 3).tolist() == [0, 1, 2]


def test_max_variance_equals_brute_force_over_all_subsets():
    for s in small_cases(seed=2):
        vals = s.tolist()
        for k in range(1, len(vals) + 1):
            best = max(exact_var([vals[i] for i in c]) for c in itertools.combinations(range(len(vals)), k))
            got = max_variance(s, k).tolist()
            assert len(set(got)) == k
            assert exact_var([vals[i] for i in got]) == best, (vals, k, got)


def test_max_variance_can_differ_from_best_worst():
    s = torch.tensor([0.0, 9.0, 10.0, 10.0, 10.0, 10.0])
    # best_worst K=4 keeps {0, 9, 10, 10}: variance 70.75/4; {0, 10, 10, 10} has 75/4
    assert sorted(s[best_worst(s, 4)].tolist()) == [0.0, 9.0, 10.0, 10.0]
    assert sorted(s[max_variance(s, 4)].tolist()) == [0.0, 10.0, 10.0, 10.0]
    assert exact_var([0, 9, 10, 10]) == Fraction(283, 16) < exact_var([0, 10, 10, 10]) == Fraction(75, 4)


def test_random_is_randperm_of_its_generator_and_uniform():
    s = torch.randn(3, 10, generator=gen(0))
    g_ref = gen(7)
    want = torch.stack([torch.randperm(10, generator=g_ref)[:4].sort().values for _ in range(3)])
    assert torch.equal(random(s, 4, generator=gen(7)), want)
    g = gen(11)
    counts = torch.zeros(6)
    draws = 3000
    for _ in range(draws):
        counts[random(torch.zeros(6), 2, generator=g)] += 1
    assert torch.allclose(counts / draws, torch.full((6,), 2 / 6), atol=0.03)


def test_extremes_random_keeps_both_extremes_and_fills_from_the_rest():
    s = torch.tensor([[0.3, 0.9, 0.1, 0.5, 0.7, 0.2], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    g_ref = gen(5)
    want = []
    for row in s.tolist():
        order = ranking(row)
        rest = [i for i in range(6) if i not in (order[0], order[-1])]
        fill = [rest[j] for j in torch.randperm(4, generator=g_ref)[:2].tolist()]
        want.append(sorted([order[0], order[-1], *fill]))
    assert extremes_random(s, 4, generator=gen(5)).tolist() == want
    assert {1, 2} <= set(want[0]) and {0, 5} <= set(want[1])
    assert extremes_random(s, 1, generator=gen(0)).tolist() == [[1], [0]]
    assert extremes_random(s[0], 6, generator=gen(0)).tolist() == list(range(6))


def test_rows_select_independently_and_the_table_dispatches():
    s = torch.randn(4, 12, generator=gen(1))
    for name in ("best_worst", "mean_deviation", "max_variance"):
        rows = torch.stack([SELECTORS[name](s[p], 5) for p in range(4)])
        assert torch.equal(select(s, 5, name), rows)
    assert set(SELECTORS) == {"best_worst", "mean_deviation", "extremes_random", "random", "max_variance"}


@pytest.mark.parametrize("bad", [
    lambda: best_worst(torch.randn(5), 0),
    lambda: best_worst(torch.randn(5), 6),
    lambda: best_worst(torch.tensor([1.0, float("nan")]), 1),
    lambda: best_worst(torch.randn(2, 3, 4), 1),
    lambda: best_worst(torch.arange(5), 2),
    lambda: select(torch.randn(5), 2, "nope"),
    lambda: top_bottom_hit_rate(torch.randn(5), torch.randn(5), 3),
    lambda: kendall_tau_b(torch.randn(5), torch.randn(6)),
])
def test_bad_input_is_a_value_error(bad):
    with pytest.raises(ValueError):
        bad()


def test_random_selectors_need_a_generator():
    with pytest.raises(TypeError, match="generator"):
        random(torch.randn(5), 2)
    with pytest.raises(TypeError, match="generator"):
        extremes_random(torch.randn(5), 3)


def test_kendall_tau_b_equals_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    g = gen(0)
    for n in (2, 3, 7, 24, 96):
        for _ in range(8):
            a = torch.randint(0, 4, (n,), generator=g).double()
            b = a + torch.randint(-2, 3, (n,), generator=g).double()
            want = stats.kendalltau(a.numpy(), b.numpy()).statistic
            got = kendall_tau_b(a, b).item()
            if math.isnan(want):                                # scipy's NaN: a constant input
                assert math.isnan(got)
            else:
                assert got == pytest.approx(want, abs=1e-12)
    x = torch.randn(3, 16, generator=g)
    y = torch.randn(3, 16, generator=g)
    want = torch.tensor([stats.kendalltau(x[i].numpy(), y[i].numpy()).statistic for i in range(3)])
    assert torch.allclose(kendall_tau_b(x, y), want.double(), atol=1e-12)
    assert kendall_tau_b(x[0], x[0]).item() == 1.0 and kendall_tau_b(x[0], -x[0]).item() == -1.0
    assert torch.isnan(kendall_tau_b(torch.ones(5), torch.randn(5)))


def test_hit_rate_by_hand():
    ref = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    scout = torch.tensor([0.9, 0.1, 0.8, 0.2, 0.3, 0.0])
    top, bottom = top_bottom_hit_rate(scout, ref, 2)
    # scout top 2 = {0, 2}: ref 5 ≥ 4 hit, ref 3 miss; scout bottom 2 = {5, 1}: ref 0 ≤ 1 hit, ref 4 miss
    assert top.item() == 0.5 and bottom.item() == 0.5
    top, bottom = top_bottom_hit_rate(ref, ref, 2, 3)
    assert top.item() == 1.0 and bottom.item() == 1.0
    # tie-aware: every reference 1 reaches the 2nd-best value 1
    top, _ = top_bottom_hit_rate(torch.tensor([0.0, 3.0, 2.0, 1.0]), torch.tensor([1.0, 1.0, 1.0, 0.0]), 2, 1)
    assert top.item() == 1.0
    both = top_bottom_hit_rate(torch.stack([scout, ref]), torch.stack([ref, ref]), 2)
    assert both[0].tolist() == [0.5, 1.0]


def test_selected_contrast_by_hand_and_limits():
    ref = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    scout = torch.tensor([0.9, 0.1, 0.8, 0.2, 0.3, 0.0])
    # scout: top {0, 2} → ref mean 4, bottom {5, 1} → 2; oracle: 4.5 − 0.5 = 4 → 2 / 4
    assert selected_contrast(scout, ref, 2).item() == 0.5
    assert selected_contrast(ref, ref, 2).item() == 1.0
    assert selected_contrast(-ref, ref, 2).item() == -1.0
    assert torch.isnan(selected_contrast(scout, torch.ones(6), 2))
    g = gen(3)
    ref = torch.randn(2000, 32, generator=g)
    noise = torch.randn(2000, 32, generator=g)
    assert selected_contrast(noise, ref, 4).mean().abs().item() < 0.03     # random scout ≈ 0
