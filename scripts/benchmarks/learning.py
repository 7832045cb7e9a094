"""Learning on the toy shapes world: GRPO, DiffusionNFT and AWR from the same shipped checkpoint, same budget.

    python scripts/bench.py learning [--iterations 60] [--eval-every 5] [--eval-prompts 0] [--out runs/bench_learning]

Each objective runs its recipe (``configs/toy/{grpo,nft,awr}.yaml``) for the same number of iterations, i.e. the
same number of rollout samples and the same rollout steps per sample, one run each (no seeds averaged: read
differences of a few points as noise). Held-out strict verifier accuracy (``eval/shapes/strict``: every check of the
prompt passes, GenEval-style) is measured on fixed held-out prompts with the deterministic ODE before training and
every ``--eval-every`` iterations, and plotted against rollout NFEs (velocity evaluations spent sampling training
data, a CFG pair counting once) and against training wall time (evaluation excluded).

DiffusionNFT reports "up to 25× fewer steps than Flow-GRPO" (reference B §1.5). ``nft_nfe_to_grpo_final`` answers
the same question here: GRPO's rollout NFEs at its end divided by the NFEs NFT needed to first reach GRPO's final
accuracy (linear interpolation between evaluations; null when NFT never reaches it within the budget, or already
starts there). The same ratio for the verifier's partial credit (mean of the per-prompt checks) is
``nft_nfe_to_grpo_final_partial``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OBJECTIVES = ("grpo", "nft", "awr")
ACC = "eval/shapes/strict/mean"
PARTIAL = "eval/shapes/partial/mean"


def parse(argv):
    ap = argparse.ArgumentParser(prog="bench.py learning", description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-prompts", type=int, default=0, help="held-out prompts per evaluation (0: all 90)")
    ap.add_argument("--seeds", default="0,1,2", help="evaluation seeds (images per prompt)")
    ap.add_argument("--objectives", default=",".join(OBJECTIVES))
    ap.add_argument("--out", default=str(REPO / "runs" / "bench_learning"))
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    return ap.parse_args(argv)


def curve(run_dir: Path, metric: str = ACC) -> list[tuple[float, float, float]]:
    """[(rollout NFEs, wall seconds, metric)] at each evaluation, from the run's metrics.jsonl."""
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    at = {r["step"]: r for r in recs if "train/rollout_nfe" in r}
    out = []
    for r in recs:
        if r.get(metric) is None:
            continue
        t = at.get(r["step"], {})
        out.append((float(t.get("train/rollout_nfe", 0)), float(t.get("time/wall", 0.0)), float(r[metric])))
    return out


def first_reach(points: list[tuple[float, float, float]], target: float) -> float | None:
    """The NFE at which the accuracy curve first reaches ``target`` (linear between evaluations)."""
    for (n0, _, a0), (n1, _, a1) in zip(points, points[1:]):
        if a0 >= target:
            return n0
        if a1 >= target:
            return n0 + (n1 - n0) * (target - a0) / (a1 - a0)
    return points[0][0] if points and points[0][2] >= target else None


def run_one(objective: str, args) -> dict:
    from flowrl.config import load_config
    from flowrl.training.trainer import train

    ov = [f"run.output_dir={args.out}", f"run.name={objective}", f"train.iterations={args.iterations}",
          f"eval.every={args.eval_every}", f"eval.num_prompts={args.eval_prompts or 'null'}", "checkpoint.every=0",
          f"eval.seeds=[{args.seeds}]",
          "log.progress=false", *args.overrides]
    cfg = load_config(REPO / "configs" / "toy" / f"{objective}.yaml", ov)
    summary = train(cfg)
    pts, partial = curve(cfg.run_dir), curve(cfg.run_dir, PARTIAL)
    return {"acc_before": summary["before"].get(ACC), "acc_after": summary["after"].get(ACC),
            "partial_before": summary["before"].get(PARTIAL), "partial_after": summary["after"].get(PARTIAL),
            "nfe": summary["state"]["rollout_nfe"], "wall_s": round(summary["state"]["wall_time"], 1),
            "palette_distance_before": summary["before"].get("eval/palette_distance/mean"),
            "palette_distance_after": summary["after"].get("eval/palette_distance/mean"),
            "curve_nfe_wall_acc": [[n, round(w, 1), a] for n, w, a in pts],
            "curve_nfe_wall_partial": [[n, round(w, 1), a] for n, w, a in partial]}


def main(argv: list[str]) -> dict:
    args = parse(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    result: dict = {"bench": "learning", "iterations": args.iterations, "eval_prompts": args.eval_prompts or "all",
                    "eval_seeds": [int(s) for s in args.seeds.split(",")]}
    for objective in args.objectives.split(","):
        print(f"[learning] {objective} ...", file=sys.stderr, flush=True)
        result[objective] = run_one(objective, args)
    if "grpo" in result and "nft" in result:
        g, n = result["grpo"], result["nft"]
        for key, final, suffix in (("curve_nfe_wall_acc", g["acc_after"], ""),
                                   ("curve_nfe_wall_partial", g["partial_after"], "_partial")):
            reach = first_reach([tuple(p) for p in n[key]], final)
            result[f"nft_nfe_at_grpo_final{suffix}"] = reach
            result[f"nft_nfe_to_grpo_final{suffix}"] = round(g["nfe"] / reach, 2) if reach else None
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
