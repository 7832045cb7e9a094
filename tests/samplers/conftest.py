"""Run the samplers tests single-threaded: on a small shared CPU, intra-op threads make elementwise math ~10× slower."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
