"""Will it fit? Predicted GPU memory per process of a run's config, before anything is built (docs/memory.md).

    python scripts/plan.py --config configs/wan21/awr_video.yaml --gpus 8 --gpu-mem 80
    python scripts/plan.py --config configs/flux/grpo_pickscore.yaml policy.path=black-forest-labs/FLUX.1-dev \
        train.micro_batch=2

Prints the table (parameters, gradients, AdamW, adapters / frozen copies, EMA, text encoders, VAE, stored samples,
activation estimates), the verdict at ``--gpu-mem`` GiB and the predicted effect of each single change, then one
JSON line for scripting. The config goes through the strict loader first: a typo'd key is the loader's one-line
``config error: …`` (exit 1) before any model is instantiated.
"""
from __future__ import annotations

import argparse
import json
import sys


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--config", "-c", default=None, help="YAML recipe (default: configs/default.yaml's defaults)")
    ap.add_argument("--gpus", type=int, default=1, help="processes (one per GPU); FSDP divides by it when on")
    ap.add_argument("--gpu-mem", type=float, default=80.0, help="memory per GPU in GiB (default 80)")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.micro_batch=2")
    args = ap.parse_args(argv)
    if args.gpus < 1 or args.gpu_mem <= 0:
        ap.error("--gpus must be ≥ 1 and --gpu-mem > 0")
    return args


def main(argv: list[str] | None = None) -> dict:
    from flowrl.config import ConfigError, check_geometry, load_config
    from flowrl.errors import one_line

    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(args.config, args.overrides)
        check_geometry(cfg, args.gpus)
    except ConfigError as e:
        print(f"config error: {one_line(e)}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    from flowrl.planning import plan
    from flowrl.planning.report import table, verdict

    p = plan(cfg, args.gpus, args.gpu_mem)
    print(table(p))
    print(verdict(p))
    out = {"plan": args.config, **p.as_dict()}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
