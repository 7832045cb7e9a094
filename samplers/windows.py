"""Which steps of a rollout are stochastic (SDE) and stored for training: the step plan and its windows.

A window is a small stateful object: ``plan(iteration, num_steps, rng=None) -> StepPlan`` says, for training
iteration n, which grid steps are SDE steps (and how many grid steps each spans); every other step is ODE.
``state_dict()/load_state_dict()`` let the trainer checkpoint a window's position (MixGRPO's sliding window).

  all       every step (Flow-GRPO; optionally without the last, as DanceGRPO / Flow-GRPO-Fast size 0 do)
  fixed     an explicit list of indices
  random    k consecutive steps starting at start ~ U{lo, …, hi − k} (Flow-GRPO-Fast, ``*_with_logprob_fast.py``)
  sliding   MixGRPO: window [c, min(c + w, max_index)); c += stride every iters_per_group iterations, roll back
            to the start at the end; optional compressed DPM-Solver++ 2M ODE tail (MixGRPO-Flash, ``sampling_utils.py``)
  merged    E-GRPO: one SDE step from σ_k straight to σ_{k+m}, ODE elsewhere (arXiv 2601.00423)
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

TAILS = (None, "dpmpp_2m")


@dataclass(frozen=True)
class StepPlan:
    """Stochastic steps of one rollout.

    sde_steps: grid indices where an SDE (stored, trainable) step starts, increasing.
    spans:     grid steps each SDE step covers (1 = an ordinary step; m > 1 = E-GRPO merged step σ_k → σ_{k+m}).
    ode_tail:  None (Euler after the last SDE step) or "dpmpp_2m" (MixGRPO-Flash compressed higher-order tail).
    tail_compress: fraction of the remaining steps the compressed tail keeps (≥ 1 step).
    """

    num_steps: int
    sde_steps: tuple[int, ...] = ()
    spans: tuple[int, ...] = ()
    ode_tail: str | None = None
    tail_compress: float = 0.4

    def __post_init__(self):
        if not self.spans:
            object.__setattr__(self, "spans", (1,) * len(self.sde_steps))
        if len(self.spans) != len(self.sde_steps):
            raise ValueError(f"StepPlan: {len(self.sde_steps)} sde_steps but {len(self.spans)} spans")
        if self.ode_tail not in TAILS:
            raise ValueError(f"StepPlan.ode_tail must be one of {TAILS}, got {self.ode_tail!r}")
        end = -1
        for k, m in zip(self.sde_steps, self.spans):
            if m < 1 or k <= end or k + m > self.num_steps:
                raise ValueError(f"StepPlan: SDE step {k} (span {m}) must be increasing, non-overlapping and "
                                 f"within the {self.num_steps}-step grid")
            end = k + m - 1

    def span_at(self, i: int) -> int:
        """Span of the SDE step starting at grid index i, 0 when step i is ODE."""
        return dict(zip(self.sde_steps, self.spans)).get(i, 0)


def _steps_or_default(num_steps: int, max_index: int | None, offset: int) -> int:
    return num_steps - offset if max_index is None else max_index


@dataclass
class AllSteps:
    """Every step is SDE (Flow-GRPO); ``skip_last`` leaves the final near-data step ODE (DanceGRPO, FG-Fast)."""

    skip_last: bool = False

    def plan(self, iteration: int, num_steps: int, rng: random.Random | None = None) -> StepPlan:
        n = num_steps - 1 if self.skip_last else num_steps
        return StepPlan(num_steps, tuple(range(n)))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class FixedSteps:
    """An explicit, fixed list of SDE step indices."""

    steps: tuple[int, ...] = (0,)

    def plan(self, iteration: int, num_steps: int, rng: random.Random | None = None) -> StepPlan:
        bad = [i for i in self.steps if not 0 <= i < num_steps]
        if bad:
            raise ValueError(f"fixed window steps {bad} lie outside the {num_steps}-step grid (0..{num_steps - 1})")
        return StepPlan(num_steps, tuple(sorted(set(self.steps))))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class RandomWindow:
    """Flow-GRPO-Fast: ``size`` consecutive SDE steps from ``start ~ U{lo, …, hi − size}`` (inclusive),
    ``(lo, hi) = window_range`` (FG config: size 2, range (0, 10)); a fresh window per call from ``rng``.
    ``size = 0`` is FG-Fast's "no window": every step but the last."""

    size: int = 2
    window_range: tuple[int, int] = (0, 10)

    def plan(self, iteration: int, num_steps: int, rng: random.Random | None = None) -> StepPlan:
        if self.size == 0:
            return StepPlan(num_steps, tuple(range(num_steps - 1)))
        lo, hi = self.window_range
        hi = min(hi, num_steps)
        if self.size < 0 or hi - self.size < lo:
            raise ValueError(f"random window of size {self.size} does not fit range ({lo}, {hi}) of a "
                             f"{num_steps}-step grid; shrink size or widen window_range")
        if rng is None:
            raise ValueError("RandomWindow.plan needs rng (a random.Random seeded from (seed, iteration))")
        start = rng.randint(lo, hi - self.size)
        return StepPlan(num_steps, tuple(range(start, start + self.size)))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class SlidingWindow:
    """MixGRPO progressive window (``GRPOTrainingStates``, MixGRPO ``fastvideo/utils/grpo_states.py``).

    Window ``[c, min(c + size, max_index))`` with ``max_index = num_steps − 2`` by default (25 steps → 23).
    Every ``iters_per_group`` iterations ``c += stride``; once ``c`` reaches ``max_index`` it rolls back to 0
    (``roll_back``) or stays at the last non-empty position. Deviation: the anchor rolls back only when
    c > max_index, so its window at c = max_index is empty; here it never is.
    ``iters_decay="exp"`` is MixGRPO's exp_decay: iters(c) = ceil(iters_per_group·exp(−k·ReLU(c − 13))).
    ``ode_tail="dpmpp_2m"`` + ``tail_compress`` (0.4 Flash, 0.2 Flash*) compress the ODE steps after the window.
    """

    size: int = 4
    stride: int = 1
    iters_per_group: int = 25
    max_index: int | None = None
    roll_back: bool = True
    iters_decay: str | None = None
    decay_threshold: int = 13
    decay_k: float = 0.1
    ode_tail: str | None = None
    tail_compress: float = 0.4
    _cur: int = field(default=0, repr=False)
    _iter_in_group: int = field(default=0, repr=False)
    _iteration: int = field(default=0, repr=False)

    def _iters_here(self) -> int:
        if self.iters_decay is None:
            return self.iters_per_group
        if self.iters_decay == "exp":
            return math.ceil(self.iters_per_group * math.exp(-self.decay_k * max(0, self._cur - self.decay_threshold)))
        raise ValueError(f"SlidingWindow.iters_decay must be None or 'exp', got {self.iters_decay!r}")

    def _advance(self, max_index: int) -> None:
        self._iter_in_group += 1
        if self._iter_in_group >= self._iters_here():
            self._iter_in_group = 0
            self._cur += self.stride
        if self._cur >= max_index:
            self._cur, self._iter_in_group = (0, 0) if self.roll_back else (max_index - 1, self._iter_in_group)
        self._iteration += 1

    def plan(self, iteration: int, num_steps: int, rng: random.Random | None = None) -> StepPlan:
        """The window for training iteration ``iteration`` (advancing the position from the last one asked)."""
        max_index = _steps_or_default(num_steps, self.max_index, 2)
        if not 0 < max_index <= num_steps:
            raise ValueError(f"sliding window max_index {max_index} must lie in 1..{num_steps}")
        if iteration < self._iteration:
            raise ValueError(f"SlidingWindow is at iteration {self._iteration}; cannot plan the earlier "
                             f"iteration {iteration} (load an older state_dict to go back)")
        while self._iteration < iteration:
            self._advance(max_index)
        steps = tuple(range(self._cur, min(self._cur + self.size, max_index)))
        return StepPlan(num_steps, steps, ode_tail=self.ode_tail, tail_compress=self.tail_compress)

    def state_dict(self) -> dict:
        return {"cur": self._cur, "iter_in_group": self._iter_in_group, "iteration": self._iteration}

    def load_state_dict(self, state: dict) -> None:
        self._cur, self._iter_in_group, self._iteration = state["cur"], state["iter_in_group"], state["iteration"]


@dataclass
class MergedStep:
    """E-GRPO: one SDE step spanning ``m`` grid steps, σ_k → σ_{k+m}, ODE elsewhere (VisualGRPO ``flux_sampler.py``).

    The released script trains ``steps=(1, 2, 3)`` with ``merges=(1, 1, 1)``; iteration n uses pair n mod len
    (or a random pair with ``rng`` when ``choose="random"``). With Flow-GRPO's kernel the merged step's std is
    ``η·sqrt(σ_k/(1−σ_k))·sqrt(σ_k − σ_{k+m})`` (:func:`merged_step_std`).
    """

    steps: tuple[int, ...] = (1, 2, 3)
    merges: tuple[int, ...] = (1, 1, 1)
    choose: str = "cycle"

    def plan(self, iteration: int, num_steps: int, rng: random.Random | None = None) -> StepPlan:
        if len(self.steps) != len(self.merges) or not self.steps:
            raise ValueError(f"merged window: steps {self.steps} and merges {self.merges} "
                             "must be equal-length, non-empty")
        if self.choose == "random":
            if rng is None:
                raise ValueError("MergedStep(choose='random').plan needs rng")
            j = rng.randrange(len(self.steps))
        elif self.choose == "cycle":
            j = iteration % len(self.steps)
        else:
            raise ValueError(f"MergedStep.choose must be 'cycle' or 'random', got {self.choose!r}")
        return StepPlan(num_steps, (self.steps[j],), (self.merges[j],))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def merged_step_std(sigmas: Tensor, k: int, m: int, eta: float = 0.7) -> Tensor:
    """E-GRPO merged-step std ``η·sqrt(σ_k/(1−σ_k))·sqrt(σ_k − σ_{k+m})`` (σ_k = 1 uses σ_{k+m} in 1−σ)."""
    s, sn = sigmas[k].float(), sigmas[k + m].float()
    denom = sn if float(s) >= 1.0 else s
    return eta * torch.sqrt(s / (1 - denom)) * torch.sqrt(s - sn)


def merged_step_entropy(sigmas: Tensor, k: int, m: int, eta: float = 0.7) -> Tensor:
    """Per-element entropy ``½log(2πe) + log(std)`` of the merged step."""
    return 0.5 * math.log(2 * math.pi * math.e) + torch.log(merged_step_std(sigmas, k, m, eta))


def window_config(window) -> dict:
    """The window's configuration (dataclass fields, without private state) for logs and checkpoints."""
    return {k: v for k, v in asdict(window).items() if not k.startswith("_")}
