"""Peak bytes of torch's CPU allocations during a call, from the profiler's memory events.

    peak = max_t Σ_{events e ≤ t} nbytes(e)    (allocations +, frees −; kineto ``[memory]`` events, CPU)

Only tensors allocated inside the call are seen, so the figure is the call's own high-water mark above what was
live before it: the CPU counterpart of ``torch.cuda.max_memory_allocated`` minus the bytes allocated at entry.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any


@contextmanager
def quiet_stderr():
    """fd 2 to /dev/null (kineto prints a banner line at each profiler start and stop)."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_allocated(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """(fn(), peak bytes above entry, bytes still held at exit) of torch CPU allocations made during ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with quiet_stderr():
        prof.start()
    try:
        out = fn()
    finally:
        with quiet_stderr():
            prof.stop()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type().name == "CPU")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return out, peak, live
