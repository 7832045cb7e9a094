"""Test-suite-wide settings.

Every test runs single-threaded: the models here are tiny, and on a small shared CPU intra-op threads only add
contention (measured ~10× slower elementwise math with two spinning OpenMP threads).

``os.fsync`` is a no-op outside tests/checkpoint/: it guards a checkpoint against power loss, which no test
simulates (a killed process's writes stay in the page cache), and the suite's ~1,000 fsyncs cost ~4 s of waiting
for the disk. tests/checkpoint/ keeps the real call, so the store's fsync path still runs in the default command.
"""
import os
from pathlib import Path

import pytest
import torch

CHECKPOINT_TESTS = Path(__file__).parent / "checkpoint"


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _no_fsync(request, monkeypatch):
    if not request.path.is_relative_to(CHECKPOINT_TESTS):
        monkeypatch.setattr(os, "fsync", lambda fd: None)
