"""What the learning benchmark does for methods that are more than a recipe: offline objectives get a dataset made
at the online methods' rollout budget, distillation objectives get their teacher's runs, and results of methods
not rerun can be carried from earlier result files.

- Offline (the recipe's objective trains on ``objective.data``): ``offline_dataset`` builds a verifier-ranked set
  from the shipped model with the recipe's own sampler and rewards (``flowrl.data.make_preferences``, the recipe's
  pairing rule), of ``iterations × prompts_per_iter × group_size / candidates`` prompts, so making it costs the same
  rollout NFEs as an online run (4 candidates × the same steps); the trainer counts each record's NFEs when it is
  first used, so the method's ``rollout_nfe`` is its dataset's cost. Built once per benchmark (seed 1000), reused.
- Distillation (the objective has ``teachers``): the teacher is a method of the benchmark (``--teacher``, default
  ``grpo``), trained first for every seed; seed s of the student distils from seed s's final checkpoint.
  ``opd_gain_share`` = student strict gain ÷ teacher strict gain (means over seeds), ``opd_nfe_ratio`` = student
  rollout NFEs ÷ teacher rollout NFEs.
- Few-step (the objective has ``real_guidance``: TDM-R1 trains a few-step student against a guided real score):
  ``reference_evals`` evaluates the untrained model with the recipe's own evaluator at ``--teacher-steps`` Euler
  steps (default 8 and 20), at the real score's guidance (the teacher) and at the student's, recorded as the
  method's ``teacher`` entry beside its few-step before → after.
- ``carry(result, files)``: methods of earlier result files that this run did not train, marked ``carried_from``,
  and the earlier files' top-level figures this run did not compute (e.g. ``opd_gain_share``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from flowrl.bench.paths import rel

CANDIDATES = 4
DATA_SEED = 1000
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}  # t_{0.975, df}


def objective_config(recipe: Path, overrides):
    from flowrl.config import load_config

    return load_config(recipe, list(overrides)).objective.config


def is_offline(recipe: Path, overrides) -> bool:
    return getattr(objective_config(recipe, overrides), "data", None) is not None


def is_distilled(recipe: Path, overrides) -> bool:
    return bool(getattr(objective_config(recipe, overrides), "teachers", None))


def is_few_step(recipe: Path, overrides) -> bool:
    return getattr(objective_config(recipe, overrides), "real_guidance", None) is not None


def reference_evals(recipe: Path, overrides, steps: list[int], eval_seeds: list[int], eval_prompts: int | None,
                    run_dir: str | Path) -> dict:
    """{"cfg<w>_<S>steps": {"strict", "partial", "strict_se_binomial", "strict_se_bootstrap", "guidance", "steps",
    "images"}} of the untrained weights under the recipe's evaluator, for S in ``steps`` and w in (the real score's
    guidance, the student's eval guidance)."""
    from flowrl.config import load_config

    base = load_config(recipe, list(overrides))
    student = base.sampler.eval_guidance if base.sampler.eval_guidance is not None else base.sampler.guidance
    out = {}
    for w in dict.fromkeys((float(base.objective.config.real_guidance), float(student))):
        for n in steps:
            out[f"cfg{w:g}_{n}steps"] = _reference_eval(recipe, overrides, n, w, eval_seeds, eval_prompts, run_dir)
    return out


def _reference_eval(recipe, overrides, steps: int, guidance: float, eval_seeds, eval_prompts, run_dir) -> dict:
    import shutil

    from flowrl.bench import learning_lib as lib
    from flowrl.config import load_config
    from flowrl.training.trainer import Trainer

    name, home = f"cfg{guidance:g}_{steps}steps", Path(run_dir) / "references"     # this function's own folder
    shutil.rmtree(home / name, ignore_errors=True)
    cfg = load_config(recipe, [*overrides, f"run.output_dir={home}", f"run.name={name}", "run.resume=false",
                               f"sampler.eval_steps={steps}", f"sampler.eval_guidance={guidance}",
                               f"eval.seeds=[{','.join(map(str, eval_seeds))}]",
                               f"eval.num_prompts={eval_prompts or 'null'}", "log.progress=false"])
    trainer = Trainer(cfg)
    print(f"[learning] reference: untrained weights, {steps} steps, CFG {guidance:g} ...", file=sys.stderr, flush=True)
    where = cfg.run_dir / "eval" / "reference"
    summary = trainer.evaluator.sample_and_score(0, "reference", where)
    point = lib.eval_point(summary, lib.read_per_prompt(where))
    return {"steps": steps, "guidance": guidance, "images": int(summary.get("eval/num_prompts", 0) *
                                                                 summary.get("eval/num_seeds", 0)),
            **{k: None if point.get(k) is None else round(float(point[k]), 4)
               for k in ("strict", "partial", "strict_se_binomial", "strict_se_bootstrap")}}


def offline_dataset(name: str, recipe: Path, run_dir: str | Path, iterations: int, overrides) -> tuple[str, dict]:
    """The dataset folder for offline method ``name`` at the online budget (built unless already there), and its
    summary {"prompts", "records", "nfe", "ties", "made_s"}."""
    import time

    from flowrl.config import load_config
    from flowrl.data.make_preferences import make_preferences

    cfg = load_config(recipe, list(overrides))
    t = cfg.train
    prompts = iterations * t.prompts_per_iter * t.group_size // CANDIDATES
    pairs = getattr(cfg.objective.config, "pairs", "best_worst")
    out = Path(run_dir) / "data" / f"{name}_{prompts}p_{pairs}"
    info = out / "made.json"
    if info.is_file():
        return str(out), json.loads(info.read_text())
    t0 = time.perf_counter()
    made = make_preferences(recipe, out, prompts=prompts, candidates=CANDIDATES, seed=DATA_SEED,
                            overrides=list(overrides), pairs=pairs)
    made["made_s"] = round(time.perf_counter() - t0, 1)
    made["manifest"] = str(Path("<run-dir>") / out.relative_to(run_dir) / Path(made["manifest"]).name)
    info.write_text(json.dumps(made))
    return str(out), made


def teacher_override(recipe: Path, overrides, teacher_run_dir: str) -> str:
    """``objective.teachers={<its one teacher>: <run dir>}``; a recipe with several teachers is refused."""
    names = list(objective_config(recipe, overrides).teachers)
    if len(names) != 1:
        raise SystemExit(f"the learning benchmark distils from one teacher; {recipe} names {names}")
    return f"objective.teachers={{{names[0]}: {teacher_run_dir}}}"


def distill_figures(methods: dict, student: str, teacher: str) -> dict:
    """opd_gain_share, opd_nfe_ratio of ``student`` against ``teacher`` (method summaries)."""
    s, t = methods[student], methods[teacher]
    share = s["gain_mean"] / t["gain_mean"] if t.get("gain_mean") else None
    ratio = s["rollout_nfe"] / t["rollout_nfe"] if t.get("rollout_nfe") else None
    return {"opd_teacher": teacher, "opd_gain_share": None if share is None else round(share, 3),
            "opd_nfe_ratio": None if ratio is None else round(ratio, 3)}


def carry(result: dict, files: list[str]) -> None:
    """Copy into ``result["methods"]`` every method of ``files`` (earlier first wins) that this run lacks, and into
    ``result`` the files' top-level figures this run left absent or None (``carried_figures`` names them)."""
    for f in files:
        old = json.loads(Path(f).read_text())
        for key, value in old.items():
            if key not in ("methods", "table", "plots", "carried_figures") and result.get(key) is None \
                    and value is not None:
                result[key] = value
                result.setdefault("carried_figures", {})[key] = rel(f)
        for name, entry in old.get("methods", {}).items():
            if name not in result["methods"]:
                result["methods"][name] = {"carried_from": rel(f), **entry}   # an earlier carry's note stays
                print(f"[learning] {name}: carried from {f}", file=sys.stderr)


def _signed(v) -> str:
    return "—" if v is None else f"{v:+.3f}"


def table(methods: dict) -> list[str]:
    """One markdown row per method: strict before → after, gain ± SE (95 % t-interval), partial gain, palette ratio,
    rollout NFEs, training NFEs, wall seconds."""
    rows = ["| method | strict before → after | strict gain ± SE | 95 % interval | partial gain | palette ×base | "
            "rollout NFEs | train NFEs | wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for name, m in methods.items():
        n = len(m.get("per_seed", [])) or 1
        se = m.get("gain_se")
        lo, hi = ((m["gain_mean"] - T95.get(n - 1, 2.0) * se, m["gain_mean"] + T95.get(n - 1, 2.0) * se)
                  if se is not None else (None, None))
        pal = (m["palette_after_mean"] / m["palette_before"]) if m.get("palette_before") else None
        se_txt, pal_txt = "—" if se is None else f"{se:.3f}", "—" if pal is None else f"×{pal:.2f}"
        rows.append(f"| {name} | {m['strict_before']:.3f} → {m['strict_after_mean']:.3f} | {_signed(m['gain_mean'])} ± "
                    f"{se_txt} | [{_signed(lo)}, {_signed(hi)}] | {_signed(m.get('partial_gain_mean'))} | {pal_txt} | "
                    f"{m['rollout_nfe']} | {m.get('train_nfe_mean')} | {m.get('wall_s_mean')} |")
    return rows
