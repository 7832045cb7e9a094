"""Shared machinery of the learning benchmarks: train a recipe once per seed with a fixed held-out evaluation,
aggregate over seeds (mean ± standard error), compare NFE budgets, plot curves.

Used by the learning benchmark and by the trees / pools / balancers / hacking benchmarks; one module, so every
user in a process shares one "before" cache::

    from flowrl.bench import learning_lib as lib

    runs = [lib.run_recipe("nft", seed=s, iterations=60, eval_every=20, eval_seeds=range(12),
                           out_dir="runs/bench_x", name=f"nft_s{s}") for s in (0, 1, 2)]
    agg = lib.aggregate(runs)                      # agg["after"]["strict_mean"], agg["after"]["strict_se"], ...
    lib.nfe_to_reach(agg["curve"], 0.35)           # rollout NFEs at which the mean strict curve first reaches 0.35
    lib.plot_curves({"nft": agg}, "curves_strict.png", metric="strict")

The statistics live in ``learning_stats`` and the drawing in ``learning_plot``; this module re-exports
them (``mean_se``, ``binomial_se``, ``bootstrap_se``, ``nfe_to_reach``, ``nfe_ratio``, ``aggregate``, ``plot_curves``,
``plot_reward_space``).

What is measured (docs/BENCHMARKS.md, "learning"):
- rollout NFE: the trainer's count (``Samples.rollout_nfe``): velocity evaluations per sample spent sampling the
  training data, a CFG pair counting once, summed over samples and iterations.
- training NFE: the policy's velocity evaluations in an iteration *outside* the rollout stage (every loss forward
  of the update under every adapter it uses, "train", "old" or the frozen reference; balancer gradient services;
  diagnostics), per sample (a call on B rows counts B, a CFG pair once), summed over iterations. Counted by
  wrapping ``policy.velocity`` from outside the trainer, so no objective is named. Backward passes are not counted.
- wall_s: the trainer's training seconds (``time/wall``, evaluation excluded); train_cpu_s: this process's CPU
  seconds in iterations (steadier than wall time on a shared machine).
- evaluation: the trainer's own (``flowrl.training.evaluation``): the held-out prompts × ``eval_seeds``, Euler ODE,
  the same starting noise every time. ``strict`` = eval/shapes/strict/mean, ``partial`` = eval/shapes/partial/mean,
  ``palette`` = eval/palette_distance/mean, ``diversity`` = eval/diversity/mean; every other eval/<x>/mean (and
  eval/alarm/<x>) is kept as ``<x>``.
- standard error of one evaluation: binomial sqrt(p(1 − p)/n) over its n images, and a bootstrap over prompts
  (prompts drawn with replacement, each with all its seeds: images of one prompt are correlated).
- "before": the evaluation of the untrained weights, computed once per (policy, eval set, sampler, rewards,
  source code) and shared through a :class:`BeforeCache`, when the "train" weights start equal to the base
  (checked on one velocity; LoRA's B = 0 start). Otherwise each run evaluates its own.
"""
from __future__ import annotations

import functools
import hashlib
import json
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from flowrl.bench import learning_stats as _stats
from flowrl.bench.paths import REPO, rel

ALIASES = {"strict": "shapes/strict", "partial": "shapes/partial", "palette": "palette_distance",
           "diversity": "diversity"}

PER_PROMPT, BOOTSTRAP_REPS, COUNTERS = _stats.PER_PROMPT, _stats.BOOTSTRAP_REPS, _stats.COUNTERS
finite, mean_se, binomial_se, bootstrap_se = _stats.finite, _stats.mean_se, _stats.binomial_se, _stats.bootstrap_se
nfe_to_reach, nfe_ratio, aggregate = _stats.nfe_to_reach, _stats.nfe_ratio, _stats.aggregate


# ------------------------------------------------------------------------------------------- "before" cache
class BeforeCache:
    """The "before" evaluations by key: in memory, and as ``<directory>/<key>.json`` when a directory is given
    (so later benchmarks reuse them). The key covers everything the evaluation depends on (``before_key``)."""

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory) if directory is not None else None
        self.memory: dict[str, dict] = {}

    def get(self, key: str) -> dict | None:
        if key not in self.memory and self.directory is not None and (self.directory / f"{key}.json").is_file():
            self.memory[key] = json.loads((self.directory / f"{key}.json").read_text())
        return self.memory.get(key)

    def put(self, key: str, entry: dict) -> None:
        self.memory[key] = entry
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.directory / f".{key}.json.tmp"
            tmp.write_text(json.dumps(entry))
            tmp.replace(self.directory / f"{key}.json")


CACHE = BeforeCache()                           # this process's shared cache (memory only until given a directory)
RUN_CACHE_ENV = "FLOWRL_BENCH_RUN_CACHE"         # a directory: finished runs are kept there and reused by key


def run_key(cfg) -> str:
    """Key of a finished run's result: the resolved config but where it is written (``run.output_dir``,
    ``run.name``) and the source code (``code_digest``). Runs are deterministic on one machine, so an equal key
    gives an equal result; a benchmark may reuse it instead of training again."""
    from flowrl.config import to_dict

    d = to_dict(cfg)
    d["run"] = {k: v for k, v in d["run"].items() if k not in ("output_dir", "name")}
    material = {"config": d, "code": code_digest()}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:24]


def run_cache() -> BeforeCache | None:
    """The finished-run cache named by ``$FLOWRL_BENCH_RUN_CACHE`` (None when unset: every run trains)."""
    import os

    directory = os.environ.get(RUN_CACHE_ENV)
    return BeforeCache(directory) if directory else None


LAB = "flowrl/bench"                             # the lab's own code: a run depends on this file only
LAB_RUN_FILES = ("flowrl/bench/learning_lib.py",)  # (how a recipe is trained, counted and evaluated)


def digested_files(roots: tuple[str, ...] = ("flowrl", "samplers", "rewards")) -> list[Path]:
    """The files that affect a run, as ``code_digest`` reads them: everything under ``roots`` but the lab
    (``flowrl/bench``: benchmarks, statistics, plots, carrying) and hidden entries (caches written at run time,
    such as the preference datasets' ``.latent_cache``), plus the lab's ``LAB_RUN_FILES``."""
    out = []
    for root in roots:
        for path in sorted((REPO / root).rglob("*")):
            name = path.relative_to(REPO).as_posix()
            rel_parts = path.relative_to(REPO).parts
            if (not path.is_file() or "__pycache__" in rel_parts or any(p.startswith(".") for p in rel_parts)
                    or (name + "/").startswith(LAB + "/")):
                continue                          # hidden entries are run-time caches (e.g. .latent_cache)
            out.append(path)
    return out + [REPO / f for f in LAB_RUN_FILES]


@functools.cache
def code_digest(roots: tuple[str, ...] = ("flowrl", "samplers", "rewards")) -> str:
    """sha256 of the Python sources of ``digested_files(roots)`` and of the names and sizes of the other files
    beside them (shipped weights), each named by its path relative to the repository root: a change to either
    invalidates cached evaluations and finished runs. Computed once per process, as the process runs the code it
    imported then, whatever is edited on disk later."""
    h = hashlib.sha256()
    for path in digested_files(roots):
        h.update(path.relative_to(REPO).as_posix().encode())
        h.update(path.read_bytes() if path.suffix == ".py" else str(path.stat().st_size).encode())
    return h.hexdigest()


def machine() -> dict:
    """The machine this process runs on: torch's version and the CPU kernel set it dispatches to. Runs repeat bit
    for bit on one machine; the same run in another session has ended elsewhere (another CPU's kernels rounding
    differently is the likely cause), so a JSON assembled across sessions records each part's."""
    import platform

    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "arch": platform.machine()}


def before_key(cfg, eval_guidance: float) -> tuple[str, dict]:
    """(key, what it hashes) of the "before" evaluation of a RunConfig: policy section (plus the seed for tiny
    random policies), eval prompts, eval section, the sampler's eval settings with the guidance as resolved
    (``Evaluator.guidance``), rewards, precision, source code."""
    from flowrl.config import to_dict

    d = to_dict(cfg)
    s = d["sampler"]
    material = {"policy": d["policy"], "tiny_seed": cfg.run.seed if d["policy"].get("tiny") else None,
                "data_eval": d["data"]["eval"], "eval": {k: d["eval"][k] for k in ("num_prompts", "seeds", "held_out",
                                                                                     "batch")},
                "sampler": {**{k: s.get(k) for k in ("eval_steps", "height", "width", "num_frames")},
                            "eval_guidance": float(eval_guidance)},
                "rewards": d["rewards"], "precision": cfg.run.mixed_precision, "code": code_digest()}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:24], material


def starts_at_base(policy, prompt: str, sampler) -> bool:
    """Whether the "train" weights give the base model's velocity exactly (one call each, σ = 0.5, no CFG)."""
    import torch

    cond = policy.encode([prompt], None, cfg=False)
    x = policy.noise([torch.Generator().manual_seed(0)], sampler.height, sampler.width, sampler.num_frames)
    sigma = torch.full((1,), 0.5)
    with torch.no_grad():
        with policy.adapter("train"):
            trained = policy.velocity(x, sigma, cond, 1.0)
        with policy.adapter(None):
            base = policy.velocity(x, sigma, cond, 1.0)
    return bool(torch.equal(trained, base))


# ------------------------------------------------------------------------------------------------ one run
def read_per_prompt(eval_dir: Path, label: str = "trained") -> dict[str, list[float]]:
    """Per-prompt means (over seeds) of the ``PER_PROMPT`` scores, from an evaluation's ``metrics.jsonl``."""
    rows: dict[str, dict[int, list[float]]] = {m: {} for m in PER_PROMPT}
    path = eval_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        rec = json.loads(line)
        if rec.get("kind") != "sample" or rec.get("policy") != label:
            continue
        for m in PER_PROMPT:
            v = finite(rec["scores"].get(ALIASES[m]))
            if v is not None:
                rows[m].setdefault(rec["prompt_idx"], []).append(v)
    return {m: [float(np.mean(v)) for _, v in sorted(r.items())] for m, r in rows.items() if r}


class Recorder:
    """Instruments a built ``Trainer`` from outside: counts the policy's velocity rows, splits them into rollout
    and training NFEs per iteration, and turns every evaluation into a curve point (``points``)."""

    def __init__(self, trainer):
        self.trainer, self.points, self.per_prompt = trainer, [], {}
        self.rows = self.rollout_rows = self.train_nfe = 0
        self.train_cpu = 0.0
        self._velocity = trainer.policy.velocity
        self._iteration, self._rollout = trainer.iteration, trainer.rollout.run
        self._evaluate = trainer.evaluator.evaluate
        self._saved = [(obj, attr, vars(obj).get(attr)) for obj, attr in (
            (trainer.policy, "velocity"), (trainer, "iteration"), (trainer.rollout, "run"),
            (trainer.evaluator, "evaluate"))]
        trainer.policy.velocity, trainer.iteration = self.velocity, self.iteration
        trainer.rollout.run, trainer.evaluator.evaluate = self.rollout, self.evaluate

    def close(self) -> None:
        """Undo the wrapping: instance attributes that were there before come back, the others are removed
        (so the classes' methods show through again)."""
        for obj, attr, before in self._saved:
            if before is not None:
                setattr(obj, attr, before)
            else:
                delattr(obj, attr)

    def velocity(self, x, *args, **kwargs):
        self.rows += int(x.shape[0])
        return self._velocity(x, *args, **kwargs)

    def rollout(self, iteration: int):
        start = self.rows
        samples = self._rollout(iteration)
        self.rollout_rows += self.rows - start
        return samples

    def iteration(self, it: int) -> dict:
        start, rollout_start, cpu = self.rows, self.rollout_rows, time.process_time()
        metrics = self._iteration(it)
        self.train_cpu += time.process_time() - cpu
        self.train_nfe += (self.rows - start) - (self.rollout_rows - rollout_start)
        return metrics

    def evaluate(self, step: int, tag: str, logger) -> dict:
        t0, cpu = time.perf_counter(), time.process_time()
        summary = self._evaluate(step, tag, logger)
        state = self.trainer.state
        point = {"iteration": step, "rollout_nfe": state.rollout_nfe, "train_nfe": self.train_nfe,
                 "wall_s": round(state.wall_time, 2), "train_cpu_s": round(self.train_cpu, 2),
                 "eval_s": round(time.perf_counter() - t0, 2), "eval_cpu_s": round(time.process_time() - cpu, 2)}
        self.per_prompt[step] = read_per_prompt(self.trainer.cfg.run_dir / "eval" / tag)
        point.update(eval_point(summary, self.per_prompt[step]))
        self.points.append(point)
        return summary


def eval_point(summary: dict, per_prompt: dict[str, list[float]]) -> dict:
    """An evaluation summary as curve fields: the ``ALIASES``, every other eval/<x>/mean (and eval/alarm/<x>) as
    ``<x>``, and the standard errors ``strict_se_binomial``, ``<m>_se_bootstrap`` (over prompts)."""
    out = {alias: finite(summary.get(f"eval/{name}/mean")) for alias, name in ALIASES.items()}
    taken = set(ALIASES.values())
    for k, v in summary.items():
        name = k[len("eval/"):].removesuffix("/mean")
        if k.startswith("eval/") and not k.endswith("/std") and name not in taken:
            out[name] = finite(v)
    images = int(summary.get("eval/num_prompts", 0) * summary.get("eval/num_seeds", 0))
    out["strict_se_binomial"] = binomial_se(out["strict"], images)
    for m, values in per_prompt.items():
        out[f"{m}_se_bootstrap"] = bootstrap_se(values)
    return out


def steps_overrides(steps: int) -> list[str]:
    """The overrides that set a recipe's rollout and evaluation steps to ``steps`` (0: the recipe's own, none)."""
    return [f"sampler.steps={steps}", f"sampler.eval_steps={steps}"] if steps else []


def recipe_path(recipe: str | Path) -> Path:
    """A recipe file: a path, or a bare name ``x`` for ``configs/toy/x.yaml``."""
    path = Path(recipe)
    if path.suffix not in (".yaml", ".yml"):
        path = REPO / "configs" / "toy" / f"{recipe}.yaml"
    if not path.is_file():
        raise ValueError(f"recipe {str(recipe)!r}: no such file {path}; give a YAML path or a name in configs/toy/")
    return path


def run_recipe(recipe: str | Path, *, seed: int, iterations: int, eval_every: int, eval_seeds: Iterable[int],
               out_dir: str | Path, name: str, overrides: Sequence[str] = (), eval_prompts: int | None = None,
               cache: BeforeCache | None = None, only_cached: bool = False) -> dict | None:
    """Train ``recipe`` once with ``run.seed = seed`` (prompt order, rollout noise, update draws, adapter init)
    for ``iterations``, evaluating every ``eval_every`` iterations and at the end on ``eval_prompts`` held-out
    prompts (None: all) × ``eval_seeds``; the run lives in ``out_dir/name`` (a previous run there is replaced).
    ``overrides`` (key=value) apply first; these settings win.

    Returns {"recipe", "name", "seed", "run_dir", "eval_prompts", "eval_seeds", "eval_images", "curve": [one point
    per evaluation, "before" first], "before", "after", "before_key" (None when the run evaluated its own),
    "before_cached", "gain_se_eval": {metric: bootstrap SE over prompts of the paired after − before},
    "rollout_nfe_counted"}; a point holds ``COUNTERS`` and the fields of ``eval_point``. ``only_cached``: return
    the finished run from ``$FLOWRL_BENCH_RUN_CACHE``, or None instead of training it."""
    from flowrl.config import load_config
    from flowrl.training.trainer import Trainer

    if iterations < 1 or eval_every < 0:
        raise ValueError(f"run_recipe: iterations must be >= 1 and eval_every >= 0, got {iterations}, {eval_every}")
    cache = CACHE if cache is None else cache
    seeds, path = [int(s) for s in eval_seeds], recipe_path(recipe)
    mine = [f"run.output_dir={out_dir}", f"run.name={name}", f"run.seed={seed}", "run.resume=false",
            f"train.iterations={iterations}", f"eval.every={eval_every}", f"eval.seeds=[{','.join(map(str, seeds))}]",
            f"eval.num_prompts={eval_prompts if eval_prompts else 'null'}", "eval.before=true", "eval.after=true",
            "checkpoint.every=0", "log.progress=false"]
    cfg = load_config(path, [*overrides, *mine])
    finished, done_key = run_cache(), run_key(cfg)
    done = finished.get(done_key) if finished is not None else None
    if done is not None:                         # its run_dir stays the directory the run was trained in
        print(f"[bench] {name}: reusing the finished run {done_key} (${RUN_CACHE_ENV})", file=sys.stderr)
        return {**done, "name": name, "reused": True}
    if only_cached:
        return None
    clear_run_dir(cfg.run_dir)
    trainer = Trainer(cfg)
    key, material = before_key(cfg, trainer.evaluator.guidance)
    shared = starts_at_base(trainer.policy, trainer.parts.eval_prompts.fixed(1)[0][0], cfg.sampler)
    cached = cache.get(key) if shared else None
    if cached is not None:
        cfg.eval.before = False                  # the trainer reads it in run(); its drift base is the cached one
        trainer.evaluator.base = cached["summary"]
    recorder = Recorder(trainer)
    try:
        summary = trainer.run()
    finally:
        recorder.close()
    if summary.get("preempted"):                 # stopped early: not a finished run, never cached as one
        raise SystemExit(f"[bench] {name}: preempted before its {iterations} iterations ended; rerun the "
                         f"benchmark (finished runs are reused through ${RUN_CACHE_ENV})")
    points, per_prompt = recorder.points, recorder.per_prompt
    if cached is not None:
        points.insert(0, dict(cached["point"]))
        per_prompt[0] = cached["per_prompt"]
    elif shared:
        cache.put(key, {"summary": summary["before"], "point": points[0], "per_prompt": per_prompt[0],
                        "material": material})
    last, n_prompts = points[-1]["iteration"], len(trainer.parts.eval_prompts.fixed(cfg.eval.num_prompts))
    gain_se = {m: bootstrap_se(np.subtract(per_prompt[last][m], per_prompt[0][m]))
               for m in PER_PROMPT if m in per_prompt[last] and m in per_prompt[0]}
    result = {"recipe": rel(path), "name": name, "seed": seed, "run_dir": str(cfg.run_dir), "eval_prompts": n_prompts,
              "eval_seeds": seeds, "eval_images": n_prompts * len(seeds), "curve": points, "before": points[0],
              "after": points[-1], "before_key": key if shared else None, "before_cached": cached is not None,
              "gain_se_eval": gain_se, "rollout_nfe_counted": recorder.rollout_rows}
    if finished is not None:
        finished.put(done_key, result)
    return result


def clear_run_dir(run_dir: Path) -> None:
    """Remove a previous run's directory (one holding its ``config.yaml``); refuse any other non-empty one."""
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return
    if not (run_dir / "config.yaml").is_file():
        raise ValueError(f"run_recipe: {run_dir} exists and is not a run directory (no config.yaml); "
                         "choose another out_dir or name")
    shutil.rmtree(run_dir)


def plot_curves(methods: dict, path: str | Path, metric: str = "strict", x: str = "rollout_nfe") -> Path:
    """PNG of ``metric`` against ``x``: per method (name → ``aggregate`` result) the mean curve and a ± SE band.
    Drawn with matplotlib (``learning_plot``, the ``plots`` extra)."""
    from flowrl.bench import learning_plot

    return learning_plot.plot_curves(methods, path, metric=metric, x=x)


def plot_reward_space(summary: dict, path: str | Path) -> Path:
    """PNG of a balancer-benchmark set in reward space: one panel per reward pair, a point ± 95 % interval per
    method. Drawn with matplotlib (``learning_plot``, the ``plots`` extra)."""
    from flowrl.bench import learning_plot

    return learning_plot.plot_reward_space(summary, path)

