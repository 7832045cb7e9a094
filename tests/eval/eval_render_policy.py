"""A shapes-world "model" for evaluation tests whose samples are ground-truth renders, so two evaluations with
different seeds differ exactly as much as the world's own randomness, and hacks can be added on top.

Sample (prompt, noise ε) ↦ render(parse(prompt), seed(ε)), seed(ε) a hash of ε. With one Euler step on the σ
grid [1, 0] and v = (x − x0)/σ the sampler lands on x0 exactly: x' = ε + (0 − 1)·(ε − x0) = x0.
"""
from __future__ import annotations

import contextlib

import torch

from flowrl.types import Cond


class RenderPolicy:
    """``decode_hack(pixels) → pixels`` alters every sample (e.g. darkening, speckle); ``collapse=True`` draws
    every seed's scene from seed 0 (each prompt always gives the same image)."""

    family, device, dtype = "toy", torch.device("cpu"), torch.float32
    default_guidance, default_noise_level = 1.0, 0.7

    def __init__(self, decode_hack=None, collapse: bool = False):
        self.decode_hack, self.collapse = decode_hack, collapse

    def encode(self, prompts, negative_prompts=None, cfg=True):
        return Cond({}, None, list(prompts))

    def latent_shape(self, height, width, num_frames=None):
        return (3, height, width)

    def noise(self, generators, height, width, num_frames=None):
        if (height, width) != (32, 32) or num_frames is not None:
            raise ValueError("RenderPolicy draws 32×32 shapes-world images only")
        return torch.stack([torch.randn(3, 32, 32, generator=g) for g in generators])

    def sigmas(self, num_steps, latents):
        if num_steps != 1:
            raise ValueError("RenderPolicy samples in exactly one step (steps=1)")
        return torch.tensor([1.0, 0.0])

    def _seed(self, eps: torch.Tensor) -> int:
        return 0 if self.collapse else int(eps.flatten()[:8].abs().sum().item() * 1e6) % (2 ** 31)

    def velocity(self, x, sigma, cond, guidance=None):
        from flowrl.data.shapes.grammar import parse
        from flowrl.data.shapes.render import render_batch

        x0 = torch.stack([torch.as_tensor(render_batch([parse(p)], self._seed(x[b])))[0]
                          for b, p in enumerate(cond.prompts)])
        return (x - (2 * x0 - 1)) / sigma.view(-1, 1, 1, 1)

    def decode(self, latents):
        pixels = ((latents + 1) / 2).clamp(0, 1)
        return pixels if self.decode_hack is None else self.decode_hack(pixels).clamp(0, 1)

    @contextlib.contextmanager
    def adapter(self, name):
        yield
