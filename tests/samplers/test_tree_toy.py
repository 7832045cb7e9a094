"""Integration on the tiny toy policy: the flat rollout through a real transformer is the pre-tree engine bit
for bit, and a BranchGRPO tree's edges (one row per trained edge, conditioning picked by root) run the GRPO
loss."""
import torch

from flowrl.objectives import grpo
from flowrl.objectives.batch import TrainBatch
from flowrl.policies.toy import ToyPolicy
from samplers import KERNELS
from samplers import tree_spec as ts
from samplers.rng import sample_generator
from samplers.rollout import rollout
from samplers.tree import assign_credit, tree_rollout
from samplers.windows import AllSteps
from tests.samplers.flat_reference import reference_rollout


def _setup(n):
    policy = ToyPolicy.tiny(seed=0)
    cond = policy.encode(["a red circle", "two blue squares"][:n], cfg=False)
    gens = [sample_generator(0, 0, p, 0) for p in range(n)]
    return policy, cond, gens


def test_toy_flat_rollout_equals_the_pre_tree_engine():
    policy, cond, gens = _setup(2)
    x1 = policy.noise(gens, 32, 32)
    sig = policy.sigmas(4, x1)

    def vf(x, s):
        return policy.velocity(x, s, cond, 1.0)

    plan = AllSteps().plan(0, 4)
    new = rollout(vf, x1, sig, plan, "flow_sde", None, [sample_generator(0, 0, p, 0) for p in range(2)])
    gens_again = [sample_generator(0, 0, p, 0) for p in range(2)]
    old = reference_rollout(vf, x1, sig, plan, "flow_sde", None, gens_again)
    assert torch.equal(new.latents, old.latents) and torch.equal(new.traj.log_prob, old.traj.log_prob)
    assert torch.equal(new.traj.x_next, old.traj.x_next) and new.nfe == old.nfe == 4


def test_toy_tree_edges_run_the_grpo_loss_unchanged():
    policy, cond, gens = _setup(2)
    x1 = policy.noise(gens, 32, 32)
    sig = policy.sigmas(4, x1)
    spec = ts.TreeSpec(ts.FixedSplits((0, 2), 2), AllSteps(), ts.SplitNoise(4.0))
    plan, branch = spec.plans(0, 4)
    calls = []

    def vf(x, s, roots):
        calls.append(roots.tolist())
        return policy.velocity(x, s, cond.select(roots), 1.0)

    with torch.no_grad():
        tree = tree_rollout(vf, x1, sig, plan, branch, noise=spec.noise, kernel="dance_sde", generators=gens)
    assert len(calls) == 4 and tree.forwards == 2 * (1 + 2 + 2 + 4) == sum(map(len, calls))
    reward = policy.decode(tree.latents).mean((1, 2, 3))
    credit = assign_credit(tree, reward, spec)
    batch = credit.batch
    assert batch.traj.x.shape[:2] == (len(batch), 1) and set(batch.root.tolist()) == {0, 1}
    train = TrainBatch(cond.select(batch.root), batch.advantage, traj=batch.traj, steps=[0], guidance=1.0,
                       kernel="dance_sde", kernel_cfg=KERNELS.get("dance_sde").Config())
    out = grpo.loss(policy, train, grpo.Config(beta_kl=0.0))
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(out.metrics["ratio"], torch.tensor(1.0), atol=1e-4, rtol=0)   # π_θ = π_old
    out.loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())
