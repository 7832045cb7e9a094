"""Shapes tests run single-threaded: the small tensors here gain nothing from intra-op threads, and on a
shared, oversubscribed CPU two spinning OpenMP threads make them many times slower."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
