"""Module-level fake rewards with shared state, imported by name (``tests.rewards.fakes:...``)."""
import math

import torch

CALLS = {"flaky": 0, "sizes": []}


def flaky_reward(batch):
    """Fails on its first call (a 500), then scores 7."""
    CALLS["flaky"] += 1
    if CALLS["flaky"] == 1:
        raise RuntimeError("transient failure")
    return torch.full((len(batch),), 7.0)


def half_nan_reward(batch):
    """Records each call's size; NaN for the first sample of each call."""
    CALLS["sizes"].append(len(batch))
    s = batch.pixels.flatten(1).mean(1)
    s[0] = math.nan
    return {"score": s, "double": 2 * s}
