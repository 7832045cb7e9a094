"""Test-suite-wide settings.

Every test runs single-threaded: the models here are tiny, and on a small shared CPU intra-op threads only add
contention (measured ~10× slower elementwise math with two spinning OpenMP threads). The whole session is
single-threaded too (pytest_configure), so collection and the module- and session-scoped fixtures that build tiny
models and pipelines (set up before any per-test fixture) get the same setting; each test restores it after.

``os.fsync`` is a no-op outside tests/checkpoint/: it guards a checkpoint against power loss, which no test
simulates (a killed process's writes stay in the page cache), and the suite's ~1,000 fsyncs cost ~4 s of waiting
for the disk. tests/checkpoint/ keeps the real call, so the store's fsync path still runs in the default command.
"""
import os
from pathlib import Path

import pytest
import torch

CHECKPOINT_TESTS = Path(__file__).parent / "checkpoint"
_THREADS = pytest.StashKey[int]()


def pytest_configure(config):
    config.stash[_THREADS] = torch.get_num_threads()
    torch.set_num_threads(1)


def pytest_unconfigure(config):
    torch.set_num_threads(config.stash.get(_THREADS, torch.get_num_threads()))


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


IMPORT_PROBE = """
import json, sys
out = {}
import rewards
from rewards import REWARDS
for n in REWARDS.names():
    n.startswith('shapes') or REWARDS.get(n)
out['rewards'] = sorted(sys.modules)
import flowrl, samplers, flowrl.policies
out['packages'] = sorted(sys.modules)
out['policies'] = flowrl.policies.POLICIES.names()
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def import_probe() -> dict:
    """What a fresh interpreter has imported (sorted ``sys.modules``) after ``import rewards`` and resolving every
    reward but the shapes ones ("rewards"), then after also importing flowrl, samplers and flowrl.policies
    ("packages"; a superset of what those imports alone load), and the policy registry's names ("policies").
    One subprocess for the three import-cost tests (tests/test_package.py, tests/rewards/test_registration.py,
    tests/policies/test_registry_lazy.py) instead of one each."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, cwd=repo,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
