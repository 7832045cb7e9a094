"""The errors flowrl raises on purpose: a bad config, a damaged checkpoint, a failing reward, a run stopped by
its skip guard, a launch that cannot work. Each carries a one-line message that names the thing and the fix.

``FlowRLError`` is their common base (each also keeps its natural built-in base: ``ConfigError`` is a
``ValueError``, ``CheckpointError`` a ``RuntimeError``, ``SkipLimitError`` a ``FloatingPointError``), so a
command-line entry point can print them as one line (``scripts/train.py``: ``error: …``, exit 1; ``--debug``
shows the traceback) and let anything else — a bug — raise with its traceback. ``ON_PURPOSE`` adds
``ValueError``: every input check in flowrl raises a one-line ``ValueError`` naming the value and its allowed
range, and ``rewards.RewardError`` is one (``rewards/`` may not import this module, see tests/test_layout.py).
"""
from __future__ import annotations


class FlowRLError(Exception):
    """Base of every error flowrl raises on purpose (its message is meant for the user, in one line)."""


class SkipLimitError(FlowRLError, FloatingPointError):
    """``train.max_skipped`` consecutive updates were skipped for non-finite values; the run stopped after
    writing a checkpoint of its last good state."""


class LaunchError(FlowRLError, RuntimeError):
    """The processes were launched in a way the run cannot work with (e.g. torchrun without a process group)."""


ON_PURPOSE = (FlowRLError, ValueError)


def one_line(error: BaseException) -> str:
    """The error's message on one line (newlines and runs of spaces collapsed)."""
    return " ".join(str(error).split()) or type(error).__name__


__all__ = ["ON_PURPOSE", "FlowRLError", "LaunchError", "SkipLimitError", "one_line"]
