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


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models are dominated by thread overhead on a shared CPU: run them single-threaded."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
