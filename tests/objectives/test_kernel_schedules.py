"""The shared regression kernel, timestep pickers and old-policy decay schedules by hand (DiffusionNFT, AWM,
FlowAWR / VideoAWR)."""
import pytest
import torch

from flowrl.objectives import old_policy, regression, timesteps


def test_rectified_target_and_forward_noise():
    v_old, v = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, -2.0]])
    torch.testing.assert_close(regression.rectified_target(v_old, v, torch.tensor([0.5])), torch.tensor([[2.0, 0.0]]))
    x0, eps = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]])
    xt = regression.forward_noise(x0, eps, torch.tensor([0.25]))
    torch.testing.assert_close(xt, torch.tensor([[0.75, 0.5]]))
    # x̂0 from the true velocity recovers x0
    torch.testing.assert_close(regression.x0_prediction(xt, torch.tensor([0.25]), regression.flow_target(x0, eps)), x0)
    w = regression.x0_abs_weight(torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 1.0]]))
    assert w.item() == pytest.approx(1e-5)


def test_rectified_regression_value_and_detached_parts():
    v_theta = torch.tensor([[1.0, 1.0]], requires_grad=True)
    v_old = torch.tensor([[0.0, 0.0]], requires_grad=True)
    ell = regression.rectified_regression(v_theta, v_old, torch.tensor([[2.0, 4.0]]), torch.tensor([0.5]),
                                          torch.tensor([3.0]))
    # target (1, 2): 3·mean((0)², (−1)²) = 1.5
    assert ell.item() == pytest.approx(1.5)
    ell.sum().backward()
    assert v_old.grad is None
    torch.testing.assert_close(v_theta.grad, torch.tensor([[0.0, -3.0]]))


def test_permuted_subset_nft():
    idx = timesteps.permuted_subset(10, 5, 0.99, torch.Generator().manual_seed(0))
    assert idx.shape == (5, 9)
    for row in idx:
        assert len(set(row.tolist())) == 9 and row.max() < 10
    assert not all(torch.equal(idx[0], r) for r in idx[1:])  # independent per sample
    with pytest.raises(ValueError, match="fraction"):
        timesteps.permuted_subset(10, 2, 0.05)


def test_stratified_awm():
    g = torch.Generator().manual_seed(1)
    bounds = torch.linspace(1, 12, 7).long()
    for _ in range(50):
        idx = timesteps.stratified(1, 12, 6, g)
        assert ((idx >= bounds[:-1]) & (idx < bounds[1:].clamp(min=bounds[:-1] + 1))).all()
    assert bounds.tolist() == [1, 2, 4, 6, 8, 10, 12]


def test_decoupled_videoawr():
    idx = timesteps.decoupled(20, 200, 0.51, torch.Generator().manual_seed(2))
    assert idx.shape == (200,) and idx.min() == 0 and idx.max() == 9
    sig = torch.linspace(1, 0, 21)
    torch.testing.assert_close(timesteps.sigmas_at(sig, torch.tensor([0, 9])), sig[[0, 9]])
    with pytest.raises(ValueError, match="terminal"):
        timesteps.sigmas_at(sig, torch.tensor([20]))


def test_decay_schedules_by_hand():
    assert old_policy.decay("nft", 0) == 0.0
    assert old_policy.decay("nft", 100) == pytest.approx(0.1)
    assert old_policy.decay("nft", 10_000) == 0.5
    assert old_policy.decay("nft_ocr", 74) == 0.0
    assert old_policy.decay("nft_ocr", 175) == pytest.approx(0.75)
    assert old_policy.decay("nft_ocr", 10_000) == 0.999
    assert old_policy.decay("marble", 10_000) == 0.95
    assert old_policy.decay("awm", 200) == pytest.approx(0.2) and old_policy.decay("awm", 10_000) == 0.3
    assert old_policy.decay("on_policy", 500) == 0.0
    assert old_policy.decay("eval_ema", 0) == pytest.approx(0.1) and old_policy.decay("eval_ema", 1000) == 0.9
    with pytest.raises(ValueError, match="known"):
        old_policy.decay("nfft", 1)


def test_soft_update():
    old, new = [torch.tensor([1.0, 1.0])], [torch.tensor([3.0, 5.0])]
    old_policy.soft_update_(old, new, 0.25)
    torch.testing.assert_close(old[0], torch.tensor([2.5, 4.0]))
    old_policy.soft_update_(old, new, 0.0)
    torch.testing.assert_close(old[0], new[0])
