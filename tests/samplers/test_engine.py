"""The sampling engine (samplers/engine.py): prompts → samples with any object that has the Policy methods.
A sample does not depend on its chunk; the engine is encode → noise → σ grid → the flat rollout, under the
named adapter; trees grow from the same noise; wraps see each chunk's model calls."""
import contextlib

import pytest
import torch

from flowrl.types import Cond
from samplers import tree_spec as ts
from samplers.engine import CURRENT, SampleSpec, SamplingEngine
from samplers.rng import randn_rows, sample_generator
from samplers.rollout import rollout
from samplers.schedule import flow_match_sigmas
from samplers.windows import AllSteps
from tests.samplers.gaussian_world import exact_velocity

SHAPE = (3, 4, 4)


class FakePolicy:
    """The Policy methods the engine calls: a prompt's embedding shifts the exact Gaussian-world velocity."""

    default_guidance = 1.0

    def __init__(self):
        self.active, self.encoded = None, []

    def encode(self, prompts, negative_prompts=None, cfg=False):
        self.encoded.append((list(prompts), negative_prompts, cfg))
        emb = torch.tensor([[float(len(p))] for p in prompts])
        return Cond({"e": emb}, {"e": torch.zeros_like(emb)} if cfg else None, list(prompts))

    def noise(self, generators, height, width, num_frames=None):
        return randn_rows(SHAPE, generators)

    def sigmas(self, num_steps, latents):
        return flow_match_sigmas(num_steps, shift=3.0)

    def velocity(self, x, sigma, cond, guidance=None):
        shift = 0.01 * cond.embeds["e"].view(-1, 1, 1, 1) * (self.active == "old")
        return exact_velocity()(x, sigma) + shift

    def decode(self, latents):
        return latents[:, :3].clamp(0, 1)

    @contextlib.contextmanager
    def adapter(self, name):
        before, self.active = self.active, name
        try:
            yield
        finally:
            self.active = before


PROMPTS = ["a", "bb", "ccc", "dddd", "eeeee"]


def gens():
    return [sample_generator(3, 1, p, 0) for p in range(len(PROMPTS))]


def spec(**kw):
    base = dict(steps=6, height=4, width=4, kernel="flow_sde", store=True, adapter="old")
    return SampleSpec(**{**base, **kw})


def test_a_sample_does_not_depend_on_its_chunk():
    plan = AllSteps().plan(0, 6)
    one = SamplingEngine(FakePolicy(), spec(chunk=None)).sample(PROMPTS, gens(), plan, decode=True)
    two = SamplingEngine(FakePolicy(), spec(chunk=2)).sample(PROMPTS, gens(), plan, decode=True)
    assert torch.allclose(one.result.latents, two.result.latents, atol=1e-6, rtol=0)
    assert torch.allclose(one.result.traj.log_prob, two.result.traj.log_prob, atol=1e-6, rtol=0)
    assert torch.equal(one.result.traj.noise, two.result.traj.noise)    # each row's own generator
    assert one.cond.prompts == two.cond.prompts == PROMPTS and one.pixels.shape == (5, 3, 4, 4)


def test_the_engine_is_encode_noise_sigmas_then_the_flat_rollout_under_its_adapter():
    policy, plan = FakePolicy(), AllSteps().plan(0, 6)
    out = SamplingEngine(policy, spec(chunk=2)).sample(PROMPTS, gens(), plan)
    assert policy.active is None                                       # the adapter is restored
    cond, g = policy.encode(PROMPTS), gens()
    with policy.adapter("old"):
        ref = rollout(lambda x, s: policy.velocity(x, s, cond), policy.noise(g, 4, 4), policy.sigmas(6, None),
                      plan, "flow_sde", None, g)
    assert torch.allclose(out.result.latents, ref.latents, atol=1e-6, rtol=0)
    cur = SamplingEngine(policy, spec(adapter=CURRENT)).sample(PROMPTS, gens(), plan)
    assert not torch.allclose(cur.result.latents, out.result.latents)  # CURRENT: the base weights here


def test_negative_prompt_and_cfg_reach_encode():
    policy = FakePolicy()
    SamplingEngine(policy, spec(guidance=3.0, negative_prompt="blurry", chunk=3)).encode(PROMPTS)
    assert policy.encoded == [(PROMPTS[:3], ["blurry"] * 3, True), (PROMPTS[3:], ["blurry"] * 2, True)]
    policy.encoded.clear()
    SamplingEngine(policy, spec(guidance=1.0, negative_prompt="blurry")).encode(PROMPTS)
    assert policy.encoded == [(PROMPTS, None, False)]


def test_a_wrap_sees_every_chunk_and_the_ode_engine_stores_nothing():
    seen = []

    def wrap(chunk, vf):
        def counted(x, s):
            seen.append((chunk.start, x.shape[0]))
            return vf(x, s)
        return counted

    eng = SamplingEngine(FakePolicy(), spec(chunk=2)).ode(4)
    out = eng.sample(PROMPTS, gens(), wrap=wrap)
    assert out.result.traj is None and out.result.nfe == 4 and eng.spec.kernel == "ode"
    assert seen == [(0, 2)] * 4 + [(2, 2)] * 4 + [(4, 1)] * 4
    assert eng.calls_per_sample(None) == 4


def test_a_tree_grows_from_the_same_noise_and_matches_the_flat_sample_without_splits():
    eng = SamplingEngine(FakePolicy(), spec(chunk=2))
    plan = AllSteps().plan(0, 6)
    cond, tree = eng.grow(PROMPTS, gens(), plan, ts.NoSplit().plan(0, 6))
    flat = eng.sample(PROMPTS, gens(), plan)
    assert cond.prompts == PROMPTS
    assert torch.allclose(tree.latents, flat.result.latents, atol=1e-6, rtol=0)


def test_bad_specs_are_one_line_errors():
    with pytest.raises(ValueError, match="at least one step"):
        SampleSpec(steps=0, height=4, width=4)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        SampleSpec(steps=2, height=4, width=4, chunk=0)
