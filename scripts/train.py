"""Train a flow-matching generator with online RL.

    python scripts/train.py                                   # the toy shapes world (configs/default.yaml)
    python scripts/train.py --config configs/toy/nft.yaml train.lr=1e-4 rewards.shapes.weight=0.5
    accelerate launch --config_file configs/accelerate/ddp.yaml scripts/train.py -c configs/sd35/grpo_pickscore.yaml
    python scripts/train.py --config configs/default.yaml --print-config     # resolved config, then exit
    python scripts/train.py --resume runs/default [train.iterations=200]     # continue a run exactly

Overrides are dotted ``key=value`` pairs parsed as YAML (``~key`` resets a key to its default). The resolved
config is written to ``<run.output_dir>/<run.name>/config.yaml``; ``--resume RUN_DIR`` reads it back.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--config", "-c", default=None,
                    help=f"YAML recipe (default: {DEFAULT.relative_to(DEFAULT.parents[1])})")
    ap.add_argument("--resume", default=None, metavar="RUN_DIR",
                    help="continue the run in RUN_DIR from its latest checkpoint")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.lr=1e-4")
    args = ap.parse_args(argv)
    if args.config is None and args.overrides and args.overrides[0].endswith((".yaml", ".yml")):
        args.config = args.overrides.pop(0)          # `train.py configs/x.yaml k=v` works too
    if args.config is not None and "=" in args.config:
        ap.error(f"--config expects a YAML file, got {args.config!r} (overrides go after it)")
    return args


def main(argv: list[str] | None = None) -> dict | None:
    from flowrl.config import ConfigError, dump_yaml, load_config, load_resolved

    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        if args.resume:
            cfg = load_resolved(args.resume, ["run.resume=true", *args.overrides])
        else:
            cfg = load_config(args.config or DEFAULT, args.overrides)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    if args.print_config:
        print(dump_yaml(cfg), end="")
        return None
    from flowrl.training.trainer import train

    try:
        summary = train(cfg)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    report(summary)
    print(f"\nrun directory: {cfg.run_dir}  (config.yaml, metrics.jsonl, checkpoints/, eval/<tag>/index.html)")
    return summary


def report(summary: dict) -> None:
    """Print the before/after evaluation side by side (eval/<reward>/mean)."""
    before, after = summary.get("before", {}), summary.get("after", {})
    keys = sorted(k for k in set(before) | set(after) if k.endswith("/mean"))
    if not keys:
        return
    print("\nheld-out evaluation        before      after")
    for k in keys:
        b, a = before.get(k, float("nan")), after.get(k, float("nan"))
        print(f"  {k[len('eval/'):-len('/mean')]:<22} {b:>9.4f}  {a:>9.4f}")


if __name__ == "__main__":
    main()
