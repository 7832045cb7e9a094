"""Train a flow-matching generator with online RL.

    python scripts/train.py                                   # the toy shapes world (configs/default.yaml)
    python scripts/train.py --config configs/toy/nft.yaml train.lr=1e-4 rewards.shapes.weight=0.5
    accelerate launch --config_file configs/accelerate/ddp.yaml scripts/train.py -c configs/sd35/grpo_pickscore.yaml
    python scripts/train.py --config configs/default.yaml --print-config     # resolved config, then exit
    python scripts/train.py --resume runs/default [train.iterations=200]     # continue a run exactly
    python scripts/train.py --resume runs/default --restart                  # start that run over (same config)
    python scripts/train.py --resume auto -c configs/toy/grpo.yaml           # resume if it has a checkpoint, else start

Overrides are dotted ``key=value`` pairs parsed as YAML (``~key`` resets a key to its default). The resolved
config is written to ``<run.output_dir>/<run.name>/config.yaml``; ``--resume RUN_DIR`` reads it back and
continues in RUN_DIR wherever it now is. A new run refuses a directory that holds checkpoints; ``--restart``
(``run.restart=true``) deletes them and starts over. ``--resume auto`` (``run.resume=auto``) takes the config
from ``--config`` and the overrides and resumes the run directory when it holds a checkpoint, else starts fresh:
one command line for every try of a job array or a torchrun restart (a run directory named ``auto``:
``--resume ./auto``). SIGTERM / SIGUSR1 (``run.preempt_signals``) stop after the current iteration with a
checkpoint, a line saying how to resume, and exit status 0 (docs/training.md "On a cluster").

Errors flowrl raises on purpose (a bad config, a damaged checkpoint, a failing reward, the skip guard, a launch
that cannot work: ``flowrl.errors.ON_PURPOSE``) are printed as one line, ``config error: …`` or ``error: …``,
with exit status 1; ``--debug`` shows the traceback instead. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--config", "-c", default=None,
                    help=f"YAML recipe (default: {DEFAULT.relative_to(DEFAULT.parents[1])})")
    ap.add_argument("--resume", default=None, metavar="RUN_DIR|auto",
                    help="continue the run in RUN_DIR from its latest checkpoint; auto: the run of --config and "
                         "the overrides, resumed when its directory holds a checkpoint, else started")
    ap.add_argument("--restart", action="store_true",
                    help="start over in a run directory that holds checkpoints (deletes them; with --resume "
                         "RUN_DIR: that run's config)")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.lr=1e-4")
    args = ap.parse_args(argv)
    if args.config is None and args.overrides and args.overrides[0].endswith((".yaml", ".yml")):
        args.config = args.overrides.pop(0)          # `train.py configs/x.yaml k=v` works too
    if args.config is not None and "=" in args.config:
        ap.error(f"--config expects a YAML file, got {args.config!r} (overrides go after it)")
    return args


def main(argv: list[str] | None = None, script: bool = False) -> dict | None:
    from flowrl.errors import ON_PURPOSE

    args = parse(sys.argv[1:] if argv is None else argv)
    args.script = script
    try:
        return run(args)
    except ON_PURPOSE as e:
        if args.debug:
            raise
        print(error_line(e), file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def run(args: argparse.Namespace) -> dict | None:
    from flowrl.config import dump_yaml, load_config, load_resolved

    if args.resume == "auto":
        cfg = load_config(args.config or DEFAULT, [*args.overrides, "run.resume=auto",
                                                   *(["run.restart=true"] if args.restart else [])])
    elif args.resume:
        mode = "run.restart=true" if args.restart else "run.resume=true"
        cfg = load_resolved(args.resume, [mode, *args.overrides])
    else:
        cfg = load_config(args.config or DEFAULT, [*args.overrides, *(["run.restart=true"] if args.restart else [])])
    if args.print_config:
        print(dump_yaml(cfg), end="")
        return None
    from flowrl.training.trainer import train

    summary = train(cfg)
    if getattr(args, "script", False):
        settle(cfg.run.preempt_signals)
    if "preempted" in summary:                          # the trainer printed how to resume; exit status 0
        return summary
    if int(os.environ.get("RANK", "0")) == 0:          # one report per run, not one per process
        report(summary)
        print(f"\nrun directory: {cfg.run_dir}  (config.yaml, metrics.jsonl, checkpoints/, eval/index.html)")
        if summary.get("before_after"):
            print(f"before | after (same prompts and seeds): {summary['before_after']}")
    return summary


def error_line(e: BaseException) -> str:
    """``config error: …`` for a config mistake, ``error: …`` for any other error raised on purpose."""
    from flowrl.config import ConfigError
    from flowrl.errors import one_line

    return f"{'config error' if isinstance(e, ConfigError) else 'error'}: {one_line(e)}"


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


def settle(signal_names: list[str]) -> None:
    """The run is over and its last checkpoint written: a preemption signal while this process prints its report
    and exits is ignored (it would only turn exit status 0 into 143). Script only; in-process callers keep theirs."""
    import signal

    for name in signal_names:
        signal.signal(signal.Signals[name], signal.SIG_IGN)


if __name__ == "__main__":
    main(script=True)
