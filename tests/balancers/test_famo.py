"""FAMO's task-logit update equals a direct transcription of Cranial-XIX/FAMO famo.py (torch.optim.Adam on w,
softmax vector-Jacobian product of the log-loss change), with the RL task loss log ℓ_k = −mean R_k / s_k."""
import copy

import pytest
import torch
import torch.nn.functional as F

from flowrl.balancers import famo, get_balancer
from flowrl.balancers.common import per_reward_advantages


class DirectFAMO:
    """FAMO as released (famo.py: get_weighted_loss / update), min_losses = 0."""

    def __init__(self, n_tasks, gamma=0.01, w_lr=0.025):
        self.min_losses = torch.zeros(n_tasks, dtype=torch.float64)
        self.w = torch.zeros(n_tasks, dtype=torch.float64, requires_grad=True)
        self.w_opt = torch.optim.Adam([self.w], lr=w_lr, weight_decay=gamma)

    def get_weighted_loss(self, losses):
        self.prev_loss = losses
        z = F.softmax(self.w, -1)
        D = losses - self.min_losses + 1e-8
        c = (z / D).sum().detach()
        return (D.log() * z / c).sum()

    def update(self, curr_loss):
        delta = (self.prev_loss - self.min_losses + 1e-8).log() - (curr_loss - self.min_losses + 1e-8).log()
        with torch.enable_grad():
            d = torch.autograd.grad(F.softmax(self.w, -1), self.w, grad_outputs=delta.detach())[0]
        self.w_opt.zero_grad()
        self.w.grad = d
        self.w_opt.step()


EPS = 1e-4
GROUPS = torch.arange(4).repeat_interleave(3)


def batches(T, K, seed, noise=0.25):
    """T reward batches (12, K) whose means drift at different rates, plus Gaussian noise."""
    gen = torch.Generator().manual_seed(seed)
    drift = torch.linspace(0.0, 0.3, T)[:, None] * torch.tensor([1.0, 0.2, -0.1][:K])   # uneven improvement
    return [0.5 + drift[t] + noise * torch.randn(12, K, generator=gen, dtype=torch.float64) for t in range(T)]


def task_loss(R, scale_from):
    """ℓ_k = exp(−mean R_k / (std R'_k + eps)) with the spread of ``scale_from`` (the step's own batch)."""
    return torch.exp(-R.mean(0) / (scale_from.std(0, unbiased=False) + EPS))


@pytest.mark.parametrize("K", [2, 3])
def test_logits_follow_direct_famo(K):
    Rs = batches(8, K, seed=K)
    ref, state = DirectFAMO(K), {}
    for t, R in enumerate(Rs):
        adv, diag = famo.balance(R, GROUPS, state=state)
        z = F.softmax(ref.w.detach(), -1)                     # the weights FAMO steps with at iteration t
        torch.testing.assert_close(torch.stack([diag[f"alpha_{k}"] for k in range(K)]).double(), z,
                                   rtol=0, atol=1e-6)
        A_k = per_reward_advantages(R, GROUPS, std="global", eps=EPS, unbiased=False)
        torch.testing.assert_close(adv, A_k @ z.detach())
        ref.get_weighted_loss(task_loss(R, R))
        if t + 1 < len(Rs):                                   # the same loss function after the step
            ref.update(task_loss(Rs[t + 1], R))
    torch.testing.assert_close(state["w"], ref.w.detach(), rtol=1e-6, atol=1e-9)
    assert not torch.allclose(state["w"], torch.zeros(K, dtype=torch.float64))


def test_slower_reward_gains_weight():
    pattern = batches(1, 2, seed=5, noise=0.05)[0]           # the same spread every step, no batch noise
    gain = torch.tensor([0.01, 0.002], dtype=torch.float64)   # reward 0 improves 5× faster
    Rs = [pattern + t * gain for t in range(30)]
    state = {}
    for R in Rs:
        _, diag = famo.balance(R, GROUPS, state=state)
    assert float(diag["alpha_1"]) > 0.6 and float(diag["loss_change_0"]) > float(diag["loss_change_1"]) > 0


def test_famo_direction_is_the_mixed_advantage_gradient():
    """With ℓ_k(θ) = exp(−J_k(θ)/s_k), ∇ of FAMO's weighted loss ∝ −Σ_k z_k ∇J_k/s_k: A = Σ z_k A_k."""
    K, P = 3, 4
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(K, P, generator=gen, dtype=torch.float64)   # J_k(θ) = a_k·θ
    s = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64)
    ref = DirectFAMO(K)
    with torch.no_grad():
        ref.w.copy_(torch.tensor([0.3, -0.2, 0.1]))
    theta = torch.zeros(P, dtype=torch.float64, requires_grad=True)
    g = torch.autograd.grad(ref.get_weighted_loss(torch.exp(-(a @ theta) / s)), theta)[0]
    z = F.softmax(ref.w.detach(), -1)
    mixed = (z[:, None] * a / s[:, None]).sum(0)
    assert float(F.cosine_similarity(g, -mixed, dim=0)) == pytest.approx(1.0, abs=1e-12)


def test_missing_reward_and_flat_reward_do_not_move_logits():
    nan = float("nan")
    R0 = torch.tensor([[0.1, 1.0], [0.5, 1.0], [0.9, 1.0], [0.3, 1.0]], dtype=torch.float64)  # reward 1 flat
    R1 = torch.tensor([[0.9, nan], [0.7, 0.0], [0.8, 0.5], [0.6, 0.2]], dtype=torch.float64)
    state, groups = {}, torch.tensor([0, 0, 1, 1])
    famo.balance(R0, groups, state=state)
    _, diag = famo.balance(R1, groups, state=state)
    assert float(diag["loss_change_1"]) == 0.0                # its advantages were 0: it did not steer
    want = (R1[:, 0].mean() - R0[:, 0].mean()) / (R0[:, 0].std(unbiased=False) + EPS)
    assert float(diag["loss_change_0"]) == pytest.approx(float(want), rel=1e-6)
    R2 = torch.tensor([[nan, 0.3], [nan, 0.1], [nan, 0.2], [nan, 0.4]], dtype=torch.float64)
    before = copy.deepcopy(state)
    adv, diag = famo.balance(R2, groups, state=state)         # reward 0 absent: no change measured for it
    assert float(diag["loss_change_0"]) == 0.0 and torch.isfinite(adv).all()
    assert state["adam_step"] == before["adam_step"] + 1


def test_static_weights_state_and_errors():
    R = batches(1, 2, seed=0)[0]
    _, d = famo.balance(R, GROUPS, weights=[3.0, 1.0], state={})
    assert float(d["alpha_0"]) == pytest.approx(0.75) and float(d["alpha_1"]) == pytest.approx(0.25)
    state = {}
    famo.balance(R, GROUPS, state=state)
    with pytest.raises(ValueError, match="logits"):
        famo.balance(torch.cat([R, R[:, :1]], 1), GROUPS, state=state)
    with pytest.raises(ValueError, match="w_lr"):
        famo.Config(w_lr=0.0)
    assert get_balancer("famo").Config is famo.Config
