"""Shapes tests run single-threaded: the small tensors here gain nothing from intra-op threads, and on a
shared, oversubscribed CPU two spinning OpenMP threads make them many times slower."""
import pytest
import torch

    yield
    torch.set_num_threads(prev)
