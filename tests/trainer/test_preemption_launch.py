"""Preemption and auto-resume under torchrun, 2 CPU processes (slow: minutes on two cores), docs/training.md
"On a cluster": SIGTERM to torchrun reaches both workers, which stop after the same iteration with one checkpoint;
rerunning the same ``--resume auto`` command ends bitwise equal to an uninterrupted run; a worker SIGKILLed under
``--max-restarts 1`` is restarted by torchrun and the group resumes from the newest checkpoint, also bitwise."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import toy_overrides  # noqa: E402
from launchers import REPO, TRAIN, cpu_env, torchrun, torchrun_cmd  # noqa: E402

from flowrl.bench.faults import final_state, same_state  # noqa: E402
from flowrl.checkpoint import list_checkpoints  # noqa: E402

pytestmark = pytest.mark.slow
ITERATIONS = 40


def args(tmp_path, name):
    return [TRAIN, "--resume", "auto", *toy_overrides(tmp_path, "nft", name=name, iterations=ITERATIONS),
            "eval.before=false", "eval.after=false", "run.cpu=true", "checkpoint.keep=2", "log.every=1"]


def start(cmd):
    return subprocess.Popen(cmd, env=cpu_env(), cwd=REPO, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_for_step(run_dir: Path, step: int, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        found = list_checkpoints(run_dir)
        if found and found[-1][0] >= step:
            return
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint {step} in {run_dir} (exit {proc.poll()})")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    torchrun(*args(out, "full"))
    return final_state(out / "full")


def test_sigterm_to_torchrun_stops_both_workers_and_the_same_command_resumes(tmp_path, reference):
    cmd = args(tmp_path, "cut") + ["checkpoint.every=0"]
    proc = start(torchrun_cmd(*cmd))
    metrics = tmp_path / "cut" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while (not metrics.exists() or metrics.read_text().count("\n") < 2) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGTERM)                       # the agent forwards it to each worker once
    out, _ = proc.communicate(timeout=300)
    stops = re.findall(r"preempted at iteration (\d+)", out)
    assert len(stops) == 1, out[-3000:]                     # printed once, by the main process
    assert [s for s, _ in list_checkpoints(tmp_path / "cut")] == [int(stops[0])] and int(stops[0]) < ITERATIONS
    assert proc.returncode != 0      # torchrun itself reports the signal it got; the workers exited 0
    torchrun(*cmd)
    assert same_state(reference, final_state(tmp_path / "cut"))


def test_a_worker_killed_under_max_restarts_resumes_with_resume_auto(tmp_path, reference):
    cmd = args(tmp_path, "cut")
    proc = subprocess.Popen(torchrun_cmd("--max-restarts", "1", *cmd), env=cpu_env(), cwd=REPO,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_step(tmp_path / "cut", 3, proc)
    workers = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True)
    os.kill(int(workers.stdout.split()[-1]), signal.SIGKILL)              # one worker of the group dies
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"resumed from \S+step_\d+ at iteration [1-9]", out), out[-3000:]
    assert same_state(reference, final_state(tmp_path / "cut"))
