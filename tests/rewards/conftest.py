import pytest
import torch

from rewards import make_input


@pytest.fixture
def images():
    g = torch.Generator().manual_seed(0)
    return torch.rand(4, 3, 32, 32, generator=g)


@pytest.fixture
def batch(images):
    return make_input(images, ["a cat", "a dog", 'a sign that says "hello"', "a tree"])
