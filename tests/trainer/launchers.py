"""Multi-process launches for the FSDP tests: ``torchrun`` / ``accelerate launch`` with 2 CPU processes (gloo),
one thread each, on a free port, checked and time-limited."""
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "scripts" / "train.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def torchrun_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
            str(free_port()), *args]


def torchrun(*args: str, timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 ARGS`` on CPU."""
    return subprocess.run(torchrun_cmd(*args), check=check, timeout=timeout, env=cpu_env(), cwd=REPO,
                          capture_output=not check, text=True)


def accelerate_launch(config_file: str, *args: str, timeout: int = 600) -> None:
    """``accelerate launch --config_file CONFIG --num_processes 2 ARGS`` on CPU (the recipe sets run.cpu)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config_file, "--num_processes",
           "2", "--main_process_port", str(free_port()), *args]
    subprocess.run(cmd, check=True, timeout=timeout, env=cpu_env(), cwd=REPO)


def one_process(*args: str, timeout: int = 600) -> None:
    subprocess.run([sys.executable, *args], check=True, timeout=timeout, env=cpu_env(), cwd=REPO)
