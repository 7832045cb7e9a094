"""Test-suite-wide settings.

Every test runs single-threaded: the models here are tiny, and on a small shared CPU intra-op threads only add
contention (measured ~10× slower elementwise math with two spinning OpenMP threads).
"""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
