"""Two CPU processes (torchrun, gloo) train exactly like one: rewards gathered, groups spanning processes,
gradients averaged. Compares the final train adapter of each rank with a single-process run."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("dist_worker.py")


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533"]
    subprocess.run([*torchrun, str(WORKER), str(tmp_path), "two"], check=True, timeout=600)
    subprocess.run([sys.executable, str(WORKER), str(tmp_path), "one"], check=True, timeout=600)
    one = torch.load(tmp_path / "one_rank0.pt")
    for rank in (0, 1):
        two = torch.load(tmp_path / f"two_rank{rank}.pt")
        for k, v in one.items():
            torch.testing.assert_close(two[k], v, rtol=1e-5, atol=1e-6)
