"""Preemption: a configured signal asks the loop to stop after the current iteration with a checkpoint.

Rule (docs/training.md "On a cluster"): the handler of each signal in ``run.preempt_signals`` (default SIGTERM,
what SLURM, Kubernetes and torchrun send before a kill, and SIGUSR1, SLURM's ``--signal=USR1@T`` warning) only
records the request. After every iteration each process calls ``should_stop``, which sums the request over the
processes (one all-reduce of a scalar), so all stop after the same iteration; the loop then writes the checkpoint
every process takes part in and returns (exit status 0). The iteration is finished, not abandoned: its checkpoint
is the one the loop writes anyway, so resume stays bitwise exact. A second signal restores the signal's default
action and re-sends it: the process dies of that signal at once (status 128 + N, ``-N`` from ``subprocess``);
the atomic store (``flowrl.checkpoint.store``: temp dir, fsync, rename) leaves the newest complete checkpoint
usable and ignores the half-written one. The previous handlers are restored when the run ends.
``config_changes`` names what a ``run.resume=auto`` rerun changed against the run's saved config.yaml.
"""
from __future__ import annotations

import os
import signal
import threading

import torch

DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")
ALLOWED = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP")


def signal_names(names, key: str = "run.preempt_signals") -> list[str]:
    """``names`` as ``SIG…`` names ("USR1", "sigterm" accepted); ValueError naming ``key`` for any other."""
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise ValueError(f"{key} must be a list of signal names such as [SIGTERM, SIGUSR1] ([] handles none), "
                         f"got {names!r}")
    out = []
    for name in names:
        full = str(name).upper() if str(name).upper().startswith("SIG") else "SIG" + str(name).upper()
        if full not in ALLOWED:
            raise ValueError(f"{key}: {name!r} cannot ask for a clean stop; choose from {', '.join(ALLOWED)} "
                             "(SIGKILL and SIGSTOP cannot be caught)")
        if full not in out:
            out.append(full)
    return out


class Preemption:
    """Context manager: installs the handlers (main thread only; elsewhere nothing is installed, with a note),
    records the first signal in ``received`` and restores the previous handlers on exit. A process forked while
    they are installed dies of the signal as by default."""

    def __init__(self, names=DEFAULT_SIGNALS):
        self.signals = [signal.Signals[n] for n in signal_names(list(names))]
        self.received: str | None = None
        self.previous: dict = {}

    def __enter__(self) -> Preemption:
        if self.signals and threading.current_thread() is not threading.main_thread():
            print("[flowrl] run.preempt_signals: not the main thread, signals are left alone", flush=True)
            return self
        self.pid = os.getpid()
        for sig in self.signals:
            self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def handle(self, signum: int, frame) -> None:
        """First signal: record it. Second: die of it now (default action, re-sent)."""
        name = signal.Signals(signum).name
        if self.received is not None or os.getpid() != self.pid:     # a forked child keeps the default action
            if os.getpid() == self.pid:
                os.write(2, f"[flowrl] second signal ({name}) while stopping: exiting now\n".encode())
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = name
        # os.write, not print: a handler may run in the middle of another print to the same stream
        os.write(2, f"[flowrl] {name} received: stopping after this iteration with a checkpoint (a second "
                    "signal exits at once)\n".encode())

    def should_stop(self, dist) -> bool:
        """Whether any process was signalled; a collective when there are several (every process calls it)."""
        flag = torch.tensor([0.0 if self.received is None else 1.0])
        return bool(dist.sum(flag).item() > 0)


def config_changes(cfg, stored_path) -> list[str]:
    """Dotted keys whose value in ``cfg`` differs from the resolved config a run wrote (``config.yaml``), leaving
    out ``run.resume`` / ``run.restart`` (how it was launched, written as false); [] when there is no file."""
    from pathlib import Path

    from flowrl.config.loader import dump_yaml, parse_yaml

    if not Path(stored_path).is_file():
        return []

    def flat(d, prefix=""):
        items = d.items() if isinstance(d, dict) else []
        out = {}
        for k, v in items:
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    old, new = flat(parse_yaml(Path(stored_path).read_text())), flat(parse_yaml(dump_yaml(cfg)))
    return sorted(k for k in old.keys() | new.keys()
                  if k not in ("run.resume", "run.restart") and old.get(k) != new.get(k))
