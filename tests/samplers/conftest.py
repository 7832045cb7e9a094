"""Run the samplers tests single-threaded: on a small shared CPU, intra-op threads make elementwise math ~10× slower."""
import pytest
import torch

    yield
    torch.set_num_threads(before)
