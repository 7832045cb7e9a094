"""Multi-process launches for the FSDP tests: ``torchrun`` / ``accelerate launch`` with 2 CPU processes (gloo),
one thread each, on a free loopback port, checked and time-limited.

A launch's output is captured: a failed launch raises with the tail of what its processes printed (the workers'
traceback, not only the launcher's exit status), and a launch whose processes failed to meet (a rendezvous or
socket error: the free port taken between our probe and torchrun's bind, a refused loopback connection) is
tried again on a new port, up to ``RETRIES`` times. Any other failure raises at once."""
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "scripts" / "train.py")
RETRIES = 2
TAIL_LINES = 80
# what a launch prints when its processes could not meet; none of it is the run's own failure
RENDEZVOUS_ERRORS = ("EADDRINUSE", "Address already in use", "DistNetworkError", "Connection refused",
                     "Connection reset by peer", "RendezvousConnectionError", "Socket Timeout")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_env() -> dict:
    """One thread a process, no CUDA, gloo on the loopback interface (no host-name lookup); this checkout first
    on the path, so a launched script imports the code under test, not another checkout's editable install."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    if Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def torchrun_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), *args]


def accelerate_cmd(config_file: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config_file, "--num_processes",
            "2", "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()), *args]


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def launch(make_cmd, timeout: int, check: bool = True, retries: int = RETRIES) -> subprocess.CompletedProcess:
    """Run ``make_cmd()`` (a fresh port each call) with output captured; see the module docstring. ``retries``: 0
    for a single process, which has no rendezvous to fail."""
    for attempt in range(retries + 1):
        cmd = make_cmd()
        proc = subprocess.run(cmd, timeout=timeout, env=cpu_env(), cwd=REPO, capture_output=True, text=True)
        printed = proc.stdout + proc.stderr
        unmet = any(s in printed for s in RENDEZVOUS_ERRORS)
        if proc.returncode == 0 or not check or not unmet or attempt == retries:
            break
        print(f"launch: the processes did not meet (try {attempt + 1}); again on a new port", file=sys.stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[1:4])} ... exited {proc.returncode}; its last lines:\n{tail(printed)}")
    return proc


def torchrun(*args: str, timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 ARGS`` on CPU (``check=False``: the result, failed or not, tried once)."""
    return launch(lambda: torchrun_cmd(*args), timeout, check)


def accelerate_launch(config_file: str, *args: str, timeout: int = 600) -> None:
    """``accelerate launch --config_file CONFIG --num_processes 2 ARGS`` on CPU (the recipe sets run.cpu)."""
    launch(lambda: accelerate_cmd(config_file, *args), timeout)


def one_process(*args: str, timeout: int = 600) -> None:
    launch(lambda: [sys.executable, *args], timeout, retries=0)
