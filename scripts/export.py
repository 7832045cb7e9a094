#!/usr/bin/env python
"""Export a training run's adapter for plain diffusers: a LoRA file or a transformer with the adapter fused.

    # LoRA in diffusers' layout: pipe.load_lora_weights("exports/lora") on StableDiffusion3/Flux/WanPipeline
    python scripts/export.py runs/sd35_grpo_pickscore --format diffusers-lora --out exports/lora

    # the transformer of step 200 with its EMA weights fused (W0 + α/r·B·A), loaded with
    # SD3Transformer2DModel.from_pretrained("exports/merged")
    python scripts/export.py runs/sd35_grpo_pickscore --step 200 --weights ema --format merged --out exports/merged

    # any checkpoint, sharded (DCP, one file per process) or not, as one torch.save file of full tensors
    # (exports/full/full_state.pt: {"step", "tensors", "state"}, torch.load(weights_only=True) on one process)
    python scripts/export.py runs/sd35_grpo_pickscore --format full-state --out exports/full

The policy is rebuilt from RUN_DIR/config.yaml (its family, weights path, dtype and LoRA config; a
``policy.tiny: true`` run rebuilds the tiny preset from ``run.seed``), the checkpoint's weights (the latest, or
``--step N``) are loaded into its "train" adapter, and ``flowrl.policies.export`` writes them (docs/policies.md,
"Export"). A sharded checkpoint (written by an FSDP run: docs/training.md "Sharded checkpoints (DCP)") is
read whole on this one process, for every format. Prints one JSON line describing what was written.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from flowrl.policies.export import FORMATS

FULL_STATE = "full-state"          # the converter: flowrl.checkpoint.sharded.to_single_file
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="a run directory (holds config.yaml and checkpoints/)")
    ap.add_argument("--step", type=int, help="checkpoint step (default: the latest checkpoint)")
    ap.add_argument("--format", required=True, choices=(*FORMATS, FULL_STATE), dest="fmt")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--weights", choices=("train", "ema", "old"), default="train",
                    help="which weights of the checkpoint: train (default), ema (eval EMA) or old")
    ap.add_argument("--dtype", choices=sorted(DTYPES), help="model dtype (default: the run's policy.dtype)")
    ap.add_argument("--device", default="cpu", help="where the merge runs (default cpu)")
    return ap.parse_args(argv)


def checkpoint_path(run_dir: Path, step: int | None) -> Path:
    """``run_dir/checkpoints/step_<N>`` for ``step``, else the run's latest complete checkpoint."""
    from flowrl.checkpoint import CHECKPOINTS_DIR, CheckpointError, list_checkpoints, resolve_checkpoint

    if step is None:
        return resolve_checkpoint(run_dir)
    found = dict(list_checkpoints(run_dir))
    if step not in found:
        raise CheckpointError(f"--step {step}: no complete checkpoint of that step in {run_dir / CHECKPOINTS_DIR}; "
                              f"available steps: {sorted(found)}")
    return found[step]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from flowrl.config import load_resolved
    from flowrl.eval.weights import checkpoint_weights
    from flowrl.policies.export import export
    from flowrl.training.parts import build_policy

    run_dir = Path(args.run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir / 'config.yaml'} not found: RUN_DIR must be a flowrl run directory "
                                "(the one holding config.yaml and checkpoints/)")
    ckpt = checkpoint_path(run_dir, args.step)
    if args.fmt == FULL_STATE:
        return full_state(ckpt, Path(args.out))
    cfg = load_resolved(run_dir, [f"policy.dtype={args.dtype}"] if args.dtype else None)
    policy = build_policy(cfg, args.device)
    with checkpoint_weights(policy, ckpt, args.weights):
        written = export(policy, args.out, args.fmt, adapter="train")
    from flowrl.checkpoint import read_manifest

    info = {"format": args.fmt, "out": str(written), "checkpoint": str(ckpt), "step": read_manifest(ckpt)["step"],
            "weights": args.weights, "family": cfg.policy.kind}
    print(json.dumps(info))
    return info


def full_state(ckpt: Path, out: Path) -> dict:
    """Convert checkpoint ``ckpt`` (sharded or not) into ``out/full_state.pt``; no policy is built."""
    from flowrl.checkpoint import read_manifest
    from flowrl.checkpoint.sharded import to_single_file

    manifest = read_manifest(ckpt)
    written = to_single_file(ckpt, out / "full_state.pt")
    info = {"format": FULL_STATE, "out": str(written), "checkpoint": str(ckpt), "step": manifest["step"],
            "layout": manifest.get("layout", "full")}
    print(json.dumps(info))
    return info


if __name__ == "__main__":
    main()
