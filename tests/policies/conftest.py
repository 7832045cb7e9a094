"""Shared helpers: reconstruct the velocity a diffusers pipeline used from its Euler steps."""
import pytest
import torch


def pipeline_step_velocities(pipe, latents, num_steps=2, **call_kwargs):
    """Run ``pipe`` for ``num_steps`` steps from ``latents``; return (sigmas, xs, vs) where xs[i] are the
    latents entering step i and vs[i] the (guided) velocity the pipeline handed to ``scheduler.step`` there.

    The scheduler instance's ``step`` is wrapped to record its inputs; the Euler update itself is checked
    too: x_{i+1} = x_i + (σ_{i+1} − σ_i)·v_i."""
    xs, vs, outs = [], [], []
    step = pipe.scheduler.step

    def recording_step(model_output, timestep, sample, *a, **kw):
        xs.append(sample.clone())
        vs.append(model_output.clone())
        out = step(model_output, timestep, sample, *a, **kw)
        outs.append(out[0].clone())
        return out

    pipe.scheduler.step = recording_step
    try:
        pipe.set_progress_bar_config(disable=True)
        pipe(latents=latents.clone(), num_inference_steps=num_steps, output_type="latent", **call_kwargs)
    finally:
        del pipe.scheduler.step
    sig = pipe.scheduler.sigmas.float()
    for i in range(num_steps):
        expected = xs[i].float() + (sig[i + 1] - sig[i]) * vs[i].float()
        torch.testing.assert_close(outs[i].float(), expected, atol=1e-6, rtol=1e-6)
    return sig, xs, vs


def perturb(policy, name, scale, seed):
    """Add scale·N(0, 1) noise to every parameter of adapter ``name`` (distinct "train" / "old" weights)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.adapter_parameters(name):
            p.add_(scale * torch.randn(p.shape, generator=g))


def generators(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


@pytest.fixture
def gens():
    return generators


def assert_sde_log_probs_are_normal(policy, x, cond, sigma, sigma_next, guidance):
    """Every SDE kernel's log-prob of its own step on ``policy``'s latents equals torch.distributions.Normal's
    (mean over the latent elements) — the kernels are shape-agnostic, this pins them to each family's layout."""
    from samplers import KERNELS

    with torch.no_grad():
        v = policy.velocity(x, sigma, cond, guidance)
    g = torch.Generator().manual_seed(7)
    dims = tuple(range(1, x.dim()))
    for name in ("flow_sde", "dance_sde", "cps"):
        k = KERNELS.get(name)
        cfg = k.config(log_prob="gaussian") if name == "cps" else k.config()
        out = k.step(x, v, sigma, sigma_next, torch.randn(x.shape, generator=g), cfg=cfg)
        std = out.std.reshape(-1, *[1] * (x.dim() - 1))
        ref = torch.distributions.Normal(out.mean, std).log_prob(out.x_next).mean(dims)
        torch.testing.assert_close(k.log_prob(out.x_next, out.mean, out.std, "mean", cfg), ref, rtol=1e-5, atol=1e-4)


def scheduler_step_calls(pipe, steps: int, **kw):
    """Run ``pipe`` for ``steps`` to latents, recording (sample, model_output) of every scheduler ``step`` call
    (the class method is wrapped: a pipeline may deepcopy its scheduler inside ``__call__``); (calls, output)."""
    cls = type(pipe.scheduler)
    calls, step = [], cls.step

    def recording(self, model_output, timestep, sample, *a, **k):
        calls.append((sample.clone(), model_output.clone()))
        return step(self, model_output, timestep, sample, *a, **k)

    cls.step = recording
    try:
        out = pipe(num_inference_steps=steps, output_type="latent", **kw)
    finally:
        cls.step = step
    return calls, out

