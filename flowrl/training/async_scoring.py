"""Asynchronous rewards (``train.async_rewards``): each rollout chunk is scored in a worker thread while the next
chunk samples, with no staleness (verl-omni ``docs/algo/async_reward.md``; Flow-Factory's reward overlap).

    with AsyncScorer(rewards) as pending:                  # one iteration
        samples = rollout.run(it, on_chunk=pending.submit)  # chunk k scored while chunk k+1 samples
        scores = pending.scores(samples, dist)               # waits for the last chunk; the same Scores

The chunks are sampled with the same weights, seeds and order as the synchronous run, and every reward scores a
sample on its own (rewards/base.py: no reward looks at another row), so R, the advantages and the update are the
synchronous run's bit for bit (tests/training/test_throughput.py). Bounded memory: at most ``max_pending`` chunks
wait for scoring; a further chunk waits for the oldest. A reward that fails raises its own ``RewardError`` (it
names the reward) from ``scores`` — or from the next ``submit`` — exactly as the synchronous call would.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from flowrl.training.scoring import Scores, reward_input, summarize


class AsyncScorer:
    """One iteration's background scoring of rollout chunks, in order, by one worker thread."""

    def __init__(self, rewards, max_pending: int = 2):
        self.rewards, self.max_pending = rewards, max_pending
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowrl-reward")
        self.futures: list[Future] = []
        self.wait_s = 0.0

    def __enter__(self) -> AsyncScorer:
        return self

    def __exit__(self, *exc) -> None:
        for f in self.futures:
            f.cancel()
        self.pool.shutdown(wait=True)

    def submit(self, pixels, prompts, group_ids, meta) -> None:
        """Queue one chunk (its decoded pixels, prompts, groups, metadata) for scoring; raises a failed earlier
        chunk's error."""
        pending = [f for f in self.futures if not f.done()]
        if len(pending) >= self.max_pending:
            pending[0].result()
        for f in self.futures:
            if f.done() and f.exception() is not None:
                f.result()
        self.futures.append(self.pool.submit(lambda: self.rewards(reward_input(pixels, prompts, group_ids, meta))))

    def scores(self, samples, dist) -> Scores:
        """Wait for every chunk and assemble the synchronous ``score_samples`` result."""
        import time

        t0 = time.perf_counter()
        outs = [f.result() for f in self.futures]
        self.wait_s = time.perf_counter() - t0
        first = outs[0]
        merged = type(first)(first.names, torch.cat([o.scores for o in outs]),
                             {k: torch.cat([o.sub_scores[k] for o in outs]) for k in first.sub_scores},
                             first.weights, torch.cat([o.total for o in outs]))
        batch = reward_input(samples.pixels, samples.prompts, samples.group_ids, samples.meta)
        return summarize(merged, batch, self.rewards.shapes_world, dist)
