"""Streaming inference with a distilled causal Wan student: frames of each chunk are emitted as soon as they
are decoded; per-chunk latency and FPS are reported, and the whole video is written to an MP4 at the end.

    python scripts/stream.py --config configs/distill/tiny.yaml --prompt "a fox in snow" --out fox.mp4 \
        [--checkpoint runs/distill_tiny] [--ema] [--original self_forcing_dmd.pt] [--frames-dir DIR] [key=value ...]
"""
from __future__ import annotations

import argparse
import json
import sys


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--prompt", default=None, help="default: the first data.train prompt")
    ap.add_argument("--out", default="stream.mp4")
    ap.add_argument("--checkpoint", default="", help="run dir or checkpoint dir with distilled weights")
    ap.add_argument("--ema", action="store_true", help="use the EMA weights of the checkpoint")
    ap.add_argument("--original", default="", help="a Self-Forcing/CausVid/RMD .pt generator checkpoint instead")
    ap.add_argument("--original-key", default="generator_ema", help="entry of the .pt to load")
    ap.add_argument("--frames-dir", default="", help="also write each chunk's frames as PNGs when emitted")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fps", type=int, default=16)
    ap.add_argument("overrides", nargs="*")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(sys.argv[1:] if argv is None else argv)
    import torch

    from flowrl.distill.config import load_config, prompt_list
    from flowrl.distill.roles import build_roles
    from flowrl.distill.sample import load_student_weights, write_stream

    cfg = load_config(args.config, args.overrides)
    roles = build_roles(cfg.model, critic=False).to("cuda" if torch.cuda.is_available() else "cpu")
    if args.checkpoint:
        load_student_weights(roles.student, args.checkpoint, ema=args.ema)
    if args.original:
        from flowrl.distill.components import original_wan_state_dict

        roles.student.transformer.load_state_dict(original_wan_state_dict(args.original, args.original_key))
    prompt = args.prompt or prompt_list(cfg.data.train)[0]

    def on_chunk(chunk):
        print(json.dumps({"chunk": chunk.index, "frames": int(chunk.frames.shape[1]),
                          "chunk_s": round(chunk.chunk_seconds, 4), "latency_s": round(chunk.latency_seconds, 4)}),
              flush=True)

    summary = write_stream(roles.student, roles, cfg, [prompt], args.out, seed=args.seed, fps=args.fps,
                           on_chunk=on_chunk, frames_dir=args.frames_dir or None)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
