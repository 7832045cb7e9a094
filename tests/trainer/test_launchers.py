"""The multi-process launch helper of the FSDP tests: a failed launch shows what its processes printed, and a
launch whose processes did not meet is tried again on a new port (launchers.py)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from launchers import RETRIES, launch  # noqa: E402


def script(tmp_path, body: str) -> list[str]:
    path = tmp_path / "child.py"
    path.write_text(body)
    return [sys.executable, str(path)]


def test_a_failed_launch_raises_with_the_processes_last_lines(tmp_path):
    cmd = script(tmp_path, "import sys\nprint('rank 1: ValueError: the real cause', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(AssertionError, match="exited 3; its last lines:\n.*the real cause"):
        launch(lambda: cmd, timeout=60)


def test_a_rendezvous_failure_is_tried_again_and_then_passes(tmp_path):
    counter = tmp_path / "tries"
    body = (f"from pathlib import Path\nimport sys\np = Path({str(counter)!r})\n"
            "n = int(p.read_text()) if p.exists() else 0\np.write_text(str(n + 1))\n"
            "if n == 0:\n    print('DistNetworkError: EADDRINUSE', file=sys.stderr)\n    sys.exit(1)\n")
    cmd = script(tmp_path, body)
    assert launch(lambda: cmd, timeout=60).returncode == 0
    assert counter.read_text() == "2"


def test_an_ordinary_failure_is_not_retried(tmp_path):
    counter = tmp_path / "tries"
    body = (f"from pathlib import Path\np = Path({str(counter)!r})\n"
            "p.write_text(str(int(p.read_text()) + 1 if p.exists() else 1))\nraise SystemExit(2)\n")
    with pytest.raises(AssertionError, match="exited 2"):
        launch(lambda: script(tmp_path, body), timeout=60)
    assert counter.read_text() == "1"
    assert RETRIES >= 1


def test_unchecked_launch_returns_the_failure_once(tmp_path):
    cmd = script(tmp_path, "import sys\nprint('Address already in use', file=sys.stderr)\nsys.exit(1)\n")
    proc = launch(lambda: cmd, timeout=60, check=False)
    assert proc.returncode == 1 and "Address already in use" in proc.stderr


def test_a_single_process_is_not_retried_on_a_connection_error(tmp_path):
    counter = tmp_path / "tries"
    body = (f"from pathlib import Path\nimport sys\np = Path({str(counter)!r})\n"
            "p.write_text(str(int(p.read_text()) + 1 if p.exists() else 1))\n"
            "print('Connection refused', file=sys.stderr)\nsys.exit(1)\n")
    with pytest.raises(AssertionError, match="Connection refused"):
        launch(lambda: script(tmp_path, body), timeout=60, retries=0)
    assert counter.read_text() == "1"


def test_only_a_restarted_worker_group_joins_under_its_own_store_prefix(monkeypatch):
    """flowrl.distributed.processes.join_restarted_group leaves the first try and single processes to accelerate
    (the restart itself: tests/trainer/test_preemption_launch.py, slow)."""
    import torch

    from flowrl.distributed.processes import join_restarted_group

    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert not join_restarted_group(cpu=True)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert not join_restarted_group(cpu=True)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not join_restarted_group(cpu=True)
    assert not torch.distributed.is_initialized()
