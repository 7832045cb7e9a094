#!/usr/bin/env python
"""Evaluation grids: fixed prompts × seeds, base vs trained checkpoints side by side, with reward scores.

    # the shipped toy model on held-out shapes prompts, scored by the shapes verifier
    python scripts/evaluate.py --policy toy --prompts heldout --seeds 0,1 --rewards shapes --out grids/toy

    # a training run: policy, prompts, seeds, rewards, steps and resolution come from runs/x/config.yaml;
    # columns = base | step_200 | step_400 for each seed
    python scripts/evaluate.py --checkpoint runs/x/checkpoints/step_00000200 runs/x --out grids/x

    # smoke run of a tiny random preset (no download)
    python scripts/evaluate.py --policy wan --tiny --prompts prompts.txt --seeds 0 --rewards none --out /tmp/g

Writes into --out: grid_NNN.png (or .mp4/.gif for video), metrics.jsonl, index.html, command.json
(see docs/evaluation.md). Prints the summary metrics as JSON.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from flowrl.eval import run_eval
from flowrl.eval.media import VIDEO_FORMATS
from flowrl.eval.weights import WEIGHT_GROUPS, checkpoint_label, checkpoint_weights, run_dir_of

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PROMPT_ALIASES = {"heldout": "shapes:heldout", "train": "shapes:train"}
# (height, width, num_frames) when neither a flag nor a run config gives them
DEFAULT_SIZE = {"toy": (32, 32, None), "sd3": (512, 512, None), "flux": (512, 512, None), "wan": (480, 832, 81)}
TINY_SIZE = {"wan": (32, 32, 5)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--policy", help="policy family (toy, sd3, flux, wan); default: the run's config, else toy")
    ap.add_argument("--path", help="weights: a local dir or hub id (default: the family default; toy: shipped)")
    ap.add_argument("--tiny", action="store_true", help="the family's tiny random preset (smoke runs, no download)")
    ap.add_argument("--seed", type=int, help="random-weight seed of --tiny (default: the run's run.seed, else 0)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), help="model dtype (default: the run's, else float32)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--checkpoint", nargs="+", default=[], metavar="CKPT",
                    help="trainer checkpoints (a checkpoint dir, or a run dir for its latest); one column group each")
    ap.add_argument("--weights", choices=WEIGHT_GROUPS, default="train",
                    help="which weights of each checkpoint: train (default), ema (eval EMA) or old")
    ap.add_argument("--no-base", action="store_true", help="with --checkpoint: leave out the base-model columns")
    ap.add_argument("--prompts", help="heldout | train | shapes:<split> | FILE.txt | FILE.jsonl")
    ap.add_argument("--num-prompts", type=int, help="use the first N prompts (shapes: N spread over skills)")
    ap.add_argument("--seeds", help="comma-separated sampling seeds, e.g. 0,1")
    ap.add_argument("--rewards", help="comma-separated reward names (REWARDS registry or module:attr), or none")
    ap.add_argument("--steps", type=int, help="ODE steps")
    ap.add_argument("--guidance", type=float, help="CFG / distilled guidance (default: the policy's)")
    ap.add_argument("--negative-prompt", help="CFG negative prompt")
    ap.add_argument("--height", type=int)
    ap.add_argument("--width", type=int)
    ap.add_argument("--num-frames", type=int, help="video policies: frames per sample")
    ap.add_argument("--batch-size", type=int, default=8, help="samples per model call")
    ap.add_argument("--rows-per-page", type=int, default=8, help="prompts per grid file")
    ap.add_argument("--max-tile", type=int, default=512, help="longest tile side in the grids (0: full size)")
    ap.add_argument("--video-format", choices=VIDEO_FORMATS, default="mp4")
    ap.add_argument("--fps", type=int, default=8)
    ap.add_argument("--save-samples", action="store_true", help="also write each sample as its own file")
    return ap.parse_args(argv)


def run_config(args: argparse.Namespace):
    """The RunConfig of the first checkpoint's run (``config.yaml``), or None."""
    if not args.checkpoint:
        return None
    run_dir = run_dir_of(args.checkpoint[0])
    if not (run_dir / "config.yaml").is_file():
        return None
    from flowrl.config import load_resolved

    return load_resolved(run_dir)


def settings(args: argparse.Namespace, cfg) -> dict:
    """Every evaluation setting: the flag when given, else the run config's value, else a default."""
    def pick(flag, from_cfg, default):
        if flag is not None:
            return flag
        return from_cfg() if cfg is not None else default

    kind = pick(args.policy, lambda: cfg.policy.kind, "toy")
    tiny = args.tiny or (cfg is not None and args.policy is None and cfg.policy.common.tiny)
    size = (TINY_SIZE.get(kind, (32, 32, None)) if tiny else DEFAULT_SIZE.get(kind, (512, 512, None)))
    s = cfg.sampler if cfg is not None else None
    rewards = pick(_names(args.rewards), lambda: _config_rewards(cfg), {"shapes": 1.0} if kind == "toy" else None)
    return {
        "policy": kind, "tiny": tiny,
        "path": pick(args.path, lambda: cfg.policy.common.path if args.policy is None else None, None),
        "dtype": pick(args.dtype, lambda: cfg.policy.common.dtype, "float32"),
        "seed": pick(args.seed, lambda: cfg.run.seed, 0),
        "prompts": PROMPT_ALIASES.get(args.prompts, args.prompts) or pick(None, lambda: cfg.data.eval,
                                                                          "shapes:heldout"),
        "num_prompts": pick(args.num_prompts, lambda: cfg.eval.num_prompts, None),
        "seeds": [int(x) for x in args.seeds.split(",")] if args.seeds else pick(None, lambda: cfg.eval.seeds, [0, 1]),
        "rewards": rewards,
        "steps": pick(args.steps, lambda: s.eval_steps, 20),
        "guidance": pick(args.guidance, lambda: s.eval_guidance if s.eval_guidance is not None else s.guidance, None),
        "negative_prompt": pick(args.negative_prompt, lambda: cfg.data.negative_prompt, None),
        "height": pick(args.height, lambda: s.height, size[0]),
        "width": pick(args.width, lambda: s.width, size[1]),
        "num_frames": pick(args.num_frames, lambda: s.num_frames, size[2]),
    }


def _names(text: str | None):
    if text is None:
        return None
    if text.strip().lower() == "none":
        return {}
    return {n.strip(): 1.0 for n in text.split(",") if n.strip()}


def _config_rewards(cfg) -> dict:
    specs = dict(cfg.rewards)
    specs.update({n: 1.0 for n in cfg.eval.held_out if n not in specs})
    return specs


def build_policy(st: dict, cfg, device: str):
    """POLICIES[kind] from ``path`` / the family default, or its tiny preset (the run's policy Config if any)."""
    from flowrl.policies import POLICIES

    cls = POLICIES.get(st["policy"])
    config = cfg.policy.config if (cfg is not None and cfg.policy.kind == st["policy"]) else None
    if st["tiny"]:
        return cls.tiny(seed=st["seed"], config=config, device=device)
    kwargs = {"dtype": DTYPES[st["dtype"]], "device": device, "config": config}
    if st["path"] is not None:
        kwargs["path"] = st["path"]
    return cls.from_pretrained(**kwargs)


def policy_columns(policy, args: argparse.Namespace, family: str) -> dict:
    """label → what run_eval evaluates: base + one entry per checkpoint, or the policy as loaded."""
    if not args.checkpoint:
        return {family: policy}
    columns = {} if args.no_base else {"base": (policy, None)}
    for ckpt in args.checkpoint:
        label = checkpoint_label(ckpt)
        if label in columns:
            label = f"{run_dir_of(ckpt).name}-{label}"
        columns[label] = (policy, lambda c=ckpt: checkpoint_weights(policy, c, args.weights))
    return columns


def load_prompt_source(source: str, seed: int):
    from flowrl.data.prompts import load_prompts

    return load_prompts(source, seed)


def build_scores(specs: dict | None, prompt_source, device: str, video: bool) -> dict | None:
    """name → scorer: the rewards (``RewardSet`` entries) plus, for image policies, the prompt set's own
    evaluation metrics (shapes world: ``palette_distance``), as the trainer's periodic evaluation scores them."""
    scores = {}
    if specs:
        from rewards import RewardSet

        scores.update({r.name: r for r in RewardSet(specs, device=device).rewards})
    if specs != {} and not video and hasattr(prompt_source, "eval_metrics"):
        scores.update(prompt_source.eval_metrics())
    return scores or None


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    cfg = run_config(args)
    st = settings(args, cfg)
    policy = build_policy(st, cfg, args.device)
    source = load_prompt_source(st["prompts"], st["seed"])
    items = source.fixed(st["num_prompts"])
    rewards = build_scores(st["rewards"], source, args.device, video=st["num_frames"] is not None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"argv": sys.argv[1:] if argv is None else list(argv), "checkpoints": args.checkpoint,
              "weights": args.weights, **{k: (v if k != "rewards" else sorted(v or {})) for k, v in st.items()}}
    (out / "command.json").write_text(json.dumps(record, indent=1, default=str))
    summary = run_eval(policy_columns(policy, args, st["policy"]), [p for p, _ in items], [m for _, m in items],
                       st["seeds"], rewards, out, steps=st["steps"], guidance=st["guidance"], height=st["height"],
                       width=st["width"], num_frames=st["num_frames"], batch_size=args.batch_size,
                       rows_per_page=args.rows_per_page, max_tile=args.max_tile or None,
                       video_format=args.video_format, fps=args.fps, save_samples=args.save_samples,
                       negative_prompt=st["negative_prompt"], title=f"flowrl evaluate: {st['policy']}")
    print(json.dumps({k: (v if math.isfinite(v) else None) for k, v in summary.items()}, indent=1))
    print(f"[flowrl] wrote {out / 'index.html'}", file=sys.stderr)
    return summary


if __name__ == "__main__":
    main()
