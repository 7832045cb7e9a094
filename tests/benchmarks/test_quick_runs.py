"""Every benchmark's ``--quick`` runs end to end (architecture issue): ``scripts/bench.py NAME --quick`` exits 0 with
one JSON object as its last stdout line. Slow (about 12 minutes for all 16 on the 2-core machine):
``python -m pytest -m slow tests/benchmarks/test_quick_runs.py``."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flowrl.bench import available

REPO = Path(__file__).resolve().parents[2]
EXTRA = {"redraw": ["--out"]}   # redraw trains nothing (no --quick); it writes its figures to a scratch folder


@pytest.mark.slow
@pytest.mark.parametrize("name", available())
def test_quick_run_exits_cleanly_with_its_json_last(name, tmp_path):
    args = [*EXTRA[name], str(tmp_path)] if name in EXTRA else ["--quick"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("FLOWRL_BENCH_RUN_CACHE", None)                  # a quick run trains from scratch
    proc = subprocess.run([sys.executable, "scripts/bench.py", name, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=900, env=env, check=False)
    assert proc.returncode == 0, f"{name}: rc {proc.returncode}: {proc.stderr[-2000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(result, dict) and result, name
