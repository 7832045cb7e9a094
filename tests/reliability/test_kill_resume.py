"""Fault injection (issue #16): a tiny toy run SIGKILLed at random points — start-up, mid-iteration, mid-save —
and resumed with ``scripts/train.py --resume`` after each kill ends bitwise equal to an uninterrupted run
(adapters, EMA, optimizer state, loop counters). The driver is ``flowrl/bench/faults.py`` (also
``bench.py reliability``); two CPU processes without run.cpu=true are refused under a real torchrun."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from reliability_runs import REPO, faults, tiny  # noqa: E402


@pytest.mark.slow
def test_kill_at_random_points_and_resume_is_bitwise_identical(tmp_path):
    out = faults().tally_kill_resume(tmp_path, tries=2, iterations=8, kills=3, seed=7)
    assert out["ok"] == out["tries"] == 2, out["failures"]
    assert out["kills"] >= 3                       # most kills hit a live run (some land after it finished)


@pytest.mark.slow
def test_torchrun_on_cpu_without_run_cpu_is_refused(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29547",
           str(REPO / "scripts" / "train.py"), *tiny(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode != 0
    assert proc.stderr.count("error: 2 processes were launched (WORLD_SIZE=2) but no GPU is visible") == 2
    assert not (tmp_path / "run" / "checkpoints").exists()
