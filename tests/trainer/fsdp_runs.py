"""test_fsdp.py's runs, launched in a background thread as soon as collection has selected a test of that file
(``pytest_collection_finish`` in conftest.py): the two torchrun processes train while the rest of the suite runs
in the pytest process, and the ``runs`` fixture waits for them. One launch, as before: the one-process run
``grpo_one`` (a sharded run resumes its checkpoint), every two-process case in one process group, then
``grpo_one_from_fsdp`` (a sharded run's checkpoint resumed on one process); the one-process runs are
``fsdp_worker.py`` alone, in their own process."""
from __future__ import annotations

import threading
from pathlib import Path

from launchers import one_process, torchrun

WORKER = Path(__file__).with_name("fsdp_worker.py")
TWO_PROCESS_CASES = ["grpo_fsdp", "grpo_ddp", "grpo_fsdp_each_pass", "grpo_fsdp_resumed", "grpo_fsdp_from_one",
                     "nft_full_fsdp",
                     "nft_full_ddp", "nft_full_fsdp_resumed", "uneven_fsdp", "uneven_ddp", "nan_loss_fsdp",
                     "bf16_fsdp", "fp32_fsdp"]


def launch_all(out: Path) -> Path:
    one_process(str(WORKER), str(out), "grpo_one")
    torchrun(str(WORKER), str(out), *TWO_PROCESS_CASES)
    one_process(str(WORKER), str(out), "grpo_one_from_fsdp")
    return out


class Background:
    """``launch_all(out)`` in a daemon thread (the launches are subprocesses, so the GIL is free meanwhile)."""

    def __init__(self, out: Path):
        self.out, self.error = out, None
        self.thread = threading.Thread(target=self._run, daemon=True, name="fsdp-runs")
        self.thread.start()

    def _run(self) -> None:
        try:
            launch_all(self.out)
        except BaseException as e:  # re-raised in the test that waits
            self.error = e

    def result(self) -> Path:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.out


_started: Background | None = None


def start(out: Path) -> None:
    global _started
    if _started is None:
        _started = Background(out)


def wait(tmp_path_factory) -> Path:
    """The runs' directory once every launch has finished (started here when collection did not)."""
    start(tmp_path_factory.mktemp("fsdp"))
    return _started.result()


def finish() -> None:
    """At session end: let a started launch finish (no orphaned workers after ``-x`` or a ^C)."""
    if _started is not None:
        _started.thread.join()
