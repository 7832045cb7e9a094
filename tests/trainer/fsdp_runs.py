"""test_fsdp.py's and test_fsdp_dcp.py's runs, the two-process launch in a background thread as soon as
collection has selected a test of those files (``pytest_collection_finish`` in conftest.py): the two torchrun
processes train while the rest of the suite runs in the pytest process, and the ``runs`` fixture waits for them.
The one-process run ``grpo_one`` here in the pytest process first (a sharded run resumes its checkpoint), then
every two-process case in one torchrun process group (``dcp_worker.py``, its output in ``launch.log``), then
``grpo_one_from_fsdp`` and ``grpo_one_from_fsdp_full`` (a sharded run's DCP and full-gather checkpoints resumed
on one process) in the pytest process once the launch has finished."""
from __future__ import annotations

import threading
from pathlib import Path

from launchers import torchrun

WORKER = Path(__file__).with_name("dcp_worker.py")      # fsdp_worker's cases plus test_fsdp_dcp.py's
TWO_PROCESS_CASES = ["grpo_fsdp", "grpo_ddp", "grpo_fsdp_each_pass", "grpo_fsdp_resumed", "grpo_fsdp_from_one",
                     "nft_full_fsdp",
                     "nft_full_ddp", "nft_full_fsdp_resumed", "uneven_fsdp", "uneven_ddp", "nan_loss_fsdp",
                     "bf16_fsdp", "fp32_fsdp", "zimage_fsdp", "zimage_ddp",
                     "grpo_fsdp_full", "grpo_fsdp_async", "grpo_fsdp_damaged"]   # sharded (DCP) checkpoints
ONE_PROCESS_AFTER = ["grpo_one_from_fsdp", "grpo_one_from_fsdp_full"]       # resumes of the two-process runs


def run_here(out: Path, case: str) -> None:
    """``dcp_worker.run_case`` in this (pytest) process, one thread as every test here runs; the trainer's
    ``save_run`` the worker sets per case is put back afterwards."""
    import dcp_worker
    import torch

    import flowrl.training.trainer as trainer_module

    before, save_run = torch.get_num_threads(), trainer_module.save_run
    torch.set_num_threads(1)
    try:
        dcp_worker.run_case(out, case)
    finally:
        torch.set_num_threads(before)
        trainer_module.save_run = save_run


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
            launched = torchrun(str(WORKER), str(self.out), *TWO_PROCESS_CASES)
            (self.out / "launch.log").write_text(launched.stdout + launched.stderr)
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
_finished: Path | None = None


def start(out: Path) -> None:
    global _started
    if _started is None:
        _started = Launch(out)


def wait(tmp_path_factory) -> Path:
    """The runs' directory once every run has finished (started here when collection did not); the one-process
    resumes run once, for test_fsdp.py and test_fsdp_dcp.py together."""
    global _finished
    if _finished is None:
        start(tmp_path_factory.mktemp("fsdp"))
        out = _started.result()
        for case in ONE_PROCESS_AFTER:
            run_here(out, case)
        _finished = out
    return _finished


def finish() -> None:
    """At session end: let a started launch finish (no orphaned workers after ``-x`` or a ^C)."""
    if _started is not None:
        _started.join()
