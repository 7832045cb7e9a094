"""test_fsdp.py's runs, the two-process launch in a background thread as soon as collection has selected a test
of that file (``pytest_collection_finish`` in conftest.py): the two torchrun processes train while the rest of
the suite runs in the pytest process, and the ``runs`` fixture waits for them. The same runs as before, in the
same places: the one-process run ``grpo_one`` here in the pytest process first (a sharded run resumes its
checkpoint), then every two-process case in one torchrun process group, then ``grpo_one_from_fsdp`` (a sharded
run's checkpoint resumed on one process) in the pytest process once the launch has finished."""
from __future__ import annotations

import threading
from pathlib import Path

from launchers import torchrun

WORKER = Path(__file__).with_name("fsdp_worker.py")
TWO_PROCESS_CASES = ["grpo_fsdp", "grpo_ddp", "grpo_fsdp_each_pass", "grpo_fsdp_resumed", "grpo_fsdp_from_one",
                     "nft_full_fsdp",
                     "nft_full_ddp", "nft_full_fsdp_resumed", "uneven_fsdp", "uneven_ddp", "nan_loss_fsdp",
                     "bf16_fsdp", "fp32_fsdp"]


def run_here(out: Path, case: str) -> None:
    """``fsdp_worker.run_case`` in this (pytest) process, one thread as every test here runs."""
    import fsdp_worker
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fsdp_worker.run_case(out, case)
    finally:
        torch.set_num_threads(before)


class Launch:
    """``grpo_one`` here, then the torchrun launch in a daemon thread (a subprocess: the GIL is free meanwhile);
    a failure of either is raised by ``result``."""

    def __init__(self, out: Path):
        self.out, self.error, self.thread = out, None, None
        try:
            run_here(out, "grpo_one")
        except Exception as e:
            self.error = e
            return
        self.thread = threading.Thread(target=self._two_process, daemon=True, name="fsdp-runs")
        self.thread.start()

    def _two_process(self) -> None:
        try:
            torchrun(str(WORKER), str(self.out), *TWO_PROCESS_CASES)
        except BaseException as e:
            self.error = e

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()

    def result(self) -> Path:
        self.join()
        if self.error is not None:
            raise self.error
        return self.out


_started: Launch | None = None


def start(out: Path) -> None:
    global _started
    if _started is None:
        _started = Launch(out)


def wait(tmp_path_factory) -> Path:
    """The runs' directory once every run has finished (started here when collection did not)."""
    start(tmp_path_factory.mktemp("fsdp"))
    out = _started.result()
    run_here(out, "grpo_one_from_fsdp")
    return out


def finish() -> None:
    """At session end: let a started launch finish (no orphaned workers after ``-x`` or a ^C)."""
    if _started is not None:
        _started.join()
