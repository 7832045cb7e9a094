"""scripts/sample.py in process on the shipped toy model and the shapes verifier: every method runs within its
NFE budget, from the same root noises, and writes its files."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("flowrl_sample_script", REPO / "scripts" / "sample.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sample_script_searches_the_shipped_toy_model(tmp_path):
    out = tmp_path / "search"
    summary = _script().main(["--policy", "toy", "--reward", "shapes", "--num-prompts", "2", "--steps", "4",
                              "--budget", "24", "--methods", "ode,best_of_n,dts,dts_star", "--out", str(out)])
    assert set(summary) == {"ode", "best_of_n", "dts", "dts_star"}
    assert summary["ode"]["nfe"] == 4 and summary["best_of_n"]["nfe"] == 24
    assert summary["dts"]["nfe"] <= 24 and summary["dts_star"]["nfe"] <= 24
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(0.0 <= r["reward"] <= 1.0 for r in rows)
    for r in rows:
        assert r["best_reward"] >= r["reward"] - 1e-6
        assert (out / r["method"] / f"p{r['prompt_idx']:04d}.png").is_file()
    best = {r["prompt_idx"]: r["reward"] for r in rows if r["method"] == "best_of_n"}
    first = {r["prompt_idx"]: r["reward"] for r in rows if r["method"] == "ode"}
    assert all(best[p] >= first[p] for p in best)      # best-of-N includes the ODE sample of the first noise
    assert json.loads((out / "command.json").read_text())["budget"] == 24
