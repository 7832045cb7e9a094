"""Objectives on the real contract: a tiny SD3 policy with peft "train"/"old" adapters, the real rollout engine
and flow_sde kernel. GRPO's ratio is 1 when train == old (fresh LoRA adapters), and every objective gives a
finite loss and a finite, non-zero gradient on the trainable parameters. ~40 s on CPU: marked slow."""
import pytest
import torch

from flowrl.objectives import TrainBatch, get_objective
from flowrl.objectives.timesteps import permuted_subset, sigmas_at

sd3 = pytest.importorskip("flowrl.policies.sd3")
rollout_mod = pytest.importorskip("samplers.rollout")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup():
    from samplers import KERNELS
    from samplers.rng import sample_generator
    from samplers.windows import StepPlan

    torch.manual_seed(0)
    policy = sd3.SD3Policy.tiny(seed=0, config=sd3.Config(max_sequence_length=16))
    prompts = ["a red cube", "a red cube", "two blue balls", "two blue balls"]
    cond = policy.encode(prompts, cfg=False)
    gens = [sample_generator(0, 0, i // 2, i % 2) for i in range(4)]
    x1 = policy.noise(gens, 32, 32)
    sigmas = policy.sigmas(3, x1)
    kernel = KERNELS.get("flow_sde")
    kcfg = kernel.Config(noise_level=0.7)
    with torch.no_grad(), policy.adapter("old"):
        res = rollout_mod.rollout(lambda x, s: policy.velocity(x, s, cond, 1.0), x1, sigmas,
                                  StepPlan(3, (0, 1)), kernel, kcfg, gens)
    return policy, cond, res, kcfg


def _grads(policy, loss):
    params = policy.trainable_parameters()
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [g for g in grads if g is not None]


def test_grpo_ratio_one_on_real_rollout(setup):
    policy, cond, res, kcfg = setup
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    spec = get_objective("grpo")
    out = spec.loss(policy, TrainBatch(cond, adv, traj=res.traj, steps=[1], guidance=1.0, kernel="flow_sde",
                                       kernel_cfg=kcfg), spec.Config())
    assert out.metrics["ratio"].item() == pytest.approx(1.0, abs=1e-5)
    assert out.metrics["clipfrac"].item() == 0.0
    grads = _grads(policy, out.loss)
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", ["nft", "awr", "awm"])
def test_forward_process_objectives_on_real_policy(setup, name):
    policy, cond, res, _ = setup
    spec = get_objective(name)
    adv = spec.prepare_advantages(torch.tensor([1.0, -1.0, 0.5, -0.5]), torch.tensor([0, 0, 1, 1]), spec.Config())
    idx = permuted_subset(res.sigmas.numel() - 1, 4, 0.99, torch.Generator().manual_seed(0))
    batch = TrainBatch(cond, adv, x0=res.latents, sigma=sigmas_at(res.sigmas, idx[:, 0]),
                       generator=torch.Generator().manual_seed(1))
    out = spec.loss(policy, batch, spec.Config())
    assert torch.isfinite(out.loss)
    grads = _grads(policy, out.loss)
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
