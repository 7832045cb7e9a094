import pytest
import torch

from flowrl.distill.causal_wan import CausalWan
from flowrl.distill.components import tiny_wan


@pytest.fixture
def student():
    """Tiny causal Wan, chunks of 2 latent frames."""
    return CausalWan(tiny_wan(0), chunk_frames=2)


@pytest.fixture
def video_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 6, 4, 4, generator=g)
    text = torch.randn(2, 8, 32, generator=g)
    return x, text
