"""Build a preference dataset (prompt, chosen, rejected) from any recipe's model + rewards, ranked by the rewards.

    python scripts/make_preferences.py --config configs/toy/nft.yaml --out data/toy_prefs --prompts 480 \
        [--candidates 4] [--pairs best_worst|all_pairs] [--seed 1000] [--checkpoint RUN_OR_STEP_DIR] [--keep-ties]
        [key=value ...]

On the shapes world the recipe's verifier ranks each prompt's candidates; the best and the worst become a record of
``<out>/preferences.jsonl`` (format and rules: flowrl/data/preferences.py, flowrl/data/make_preferences.py). Train
on it with ``objective: {kind: dpo, data: <out>}`` (configs/toy/dpo_offline.yaml) or ``{kind: sft, data: <out>}``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str]) -> dict:
    from flowrl.data.make_preferences import make_preferences

    ap = argparse.ArgumentParser(prog="make_preferences.py", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="the recipe whose policy, sampler and rewards make the data")
    ap.add_argument("--out", required=True, help="the dataset folder")
    ap.add_argument("--prompts", type=int, required=True, help="training prompts to sample (one record each)")
    ap.add_argument("--candidates", type=int, default=4, help="images per prompt (verl-omni: 4)")
    ap.add_argument("--seed", type=int, default=1000, help="prompt order and noise (run.seed)")
    ap.add_argument("--checkpoint", default=None, help="sample with a trainer checkpoint's weights")
    ap.add_argument("--pairs", default="best_worst", choices=["best_worst", "all_pairs"],
                    help="one pair per prompt (best vs worst) or every strictly ordered pair of its candidates")
    ap.add_argument("--keep-ties", action="store_true", help="keep prompts whose candidates all score the same")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the recipe")
    a = ap.parse_args(argv)
    try:
        return make_preferences(a.config, a.out, prompts=a.prompts, candidates=a.candidates, seed=a.seed,
                                checkpoint=a.checkpoint, overrides=a.overrides, keep_ties=a.keep_ties,
                                pairs=a.pairs)
    except ValueError as e:
        raise SystemExit(f"make_preferences: {e}") from None


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
