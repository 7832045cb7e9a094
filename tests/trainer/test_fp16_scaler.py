"""fp16 loss scaling: gradients are unscaled before clipping and the optimizer steps through the scaler."""
from types import SimpleNamespace

import torch

from flowrl.distributed.processes import Dist


class ScalingAccelerator(SimpleNamespace):
    """The parts of accelerate's Accelerator that Dist uses, with a real GradScaler (as fp16 on a GPU)."""

    def backward(self, loss):
        self.scaler.scale(loss).backward()


def test_gradients_are_unscaled_before_clipping_and_the_step_uses_the_scaler():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    dist = Dist.__new__(Dist)
    dist.accelerator, dist.rank, dist.world = ScalingAccelerator(scaler=scaler), 0, 1
    dist.backward((w ** 2).sum())
    assert torch.allclose(w.grad, 1024.0 * torch.tensor([2.0, -4.0]))      # scaled by backward
    dist.unscale_gradients(opt)
    assert torch.allclose(w.grad, torch.tensor([2.0, -4.0]))               # the true gradient, for clipping
    dist.optimizer_step(opt)
    assert torch.allclose(w.detach(), torch.tensor([0.8, -1.6]))


def test_without_a_scaler_nothing_changes():
    w = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.SGD([w], lr=0.5)
    dist = Dist(None)
    dist.backward((w ** 2).sum())
    dist.unscale_gradients(opt)
    dist.optimizer_step(opt)
    assert torch.allclose(w.detach(), torch.tensor([0.0]))
