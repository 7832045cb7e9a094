"""An analytic policy for evaluation tests: its ODE solution is known in closed form.

The velocity is the exact straight-line field towards a prompt-dependent target image x0:
v(x, σ) = (x − x0)/σ  (from x_σ = (1−σ)x0 + σε, v = ε − x0). Euler on this field lands exactly on x0
(each step keeps x on the line between x0 and ε), so the decoded image is x0 whatever the noise.
The "train" weight set adds a learnable brightness shift (a one-element parameter), so checkpoint loading
can be tested without a neural network.
"""
from __future__ import annotations

import contextlib

import torch

from flowrl.types import Cond


class AnalyticPolicy:
    """Prompt i ↦ constant image of brightness ``level(prompt)``; adapter "train" adds ``shift``."""

    family, device, dtype = "toy", torch.device("cpu"), torch.float32
    default_guidance, default_noise_level = 1.0, 0.7

    def __init__(self, video_frames: int | None = None, shift: float = 0.0, exact: bool = True):
        self.frames, self.exact, self.active = video_frames, exact, None
        self.shift = torch.nn.Parameter(torch.tensor([float(shift)]))
        self.calls = []

    def level(self, prompt: str) -> float:
        return (len(prompt) % 5) / 5 + 0.1

    def encode(self, prompts, negative_prompts=None, cfg=True):
        return Cond({"level": torch.tensor([self.level(p) for p in prompts])}, None, list(prompts))

    def latent_shape(self, height, width, num_frames=None):
        return (3, height, width) if num_frames is None else (3, num_frames, height, width)

    def noise(self, generators, height, width, num_frames=None):
        shape = self.latent_shape(height, width, num_frames)
        return torch.stack([torch.randn(shape, generator=g) for g in generators])

    def sigmas(self, num_steps, latents):
        return torch.linspace(1, 0, num_steps + 1)

    def target(self, cond, like):
        lv = cond.embeds["level"] + (self.shift.detach() if self.active == "train" else 0.0)
        return lv.view(-1, *[1] * (like.dim() - 1)).expand_as(like)

    def velocity(self, x, sigma, cond, guidance=None):
        self.calls.append(guidance)
        x0 = self.target(cond, x)
        v = (x - x0) / sigma.view(-1, *[1] * (x.dim() - 1))
        return v if self.exact else v + 0.1 * x  # inexact: the final image depends on the noise

    def decode(self, latents):
        return latents.clamp(0, 1) if latents.dim() == 4 else latents.transpose(1, 2).clamp(0, 1)

    @contextlib.contextmanager
    def adapter(self, name):
        prev, self.active = self.active, name
        try:
            yield
        finally:
            self.active = prev

    def trainable_parameters(self):
        return [self.shift]

    def adapter_state_dict(self, name="train"):
        return {"shift": self.shift.detach().clone()}

    @torch.no_grad()
    def load_adapter_state_dict(self, state, name="train"):
        self.shift.copy_(state["shift"])
