"""Streaming-video DMD distillation (Self-Forcing DMD, Stream-R1, RMD, ODE init) — see docs/distill.md.

    accelerate launch scripts/distill.py --config configs/distill/tiny.yaml [--resume | --restart] [key=value ...]

The run lives in ``<run.output_dir>/<run.name>``. ``--resume`` (``run.resume=true``) continues from its newest
checkpoint; a new run refuses a directory that holds checkpoints unless ``--restart`` (``run.restart=true``,
deletes them). ``--sample out.mp4`` streams one video from the EMA student at the end; ``--grid grid.mp4``
writes an eval grid (``data.eval`` prompts × {init, distilled}).
"""
from __future__ import annotations

import argparse
import json
import sys


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="YAML recipe, e.g. configs/distill/tiny.yaml")
    ap.add_argument("--resume", action="store_true", help="continue from the run dir's newest checkpoint")
    ap.add_argument("--restart", action="store_true", help="start over, deleting the run dir's checkpoints")
    ap.add_argument("--iterations", type=int, default=None, help="stop after this many iterations (total)")
    ap.add_argument("--sample", default="", help="write a streamed MP4 from the EMA student at the end")
    ap.add_argument("--grid", default="", help="write a prompts × {init, distilled EMA} video grid (mp4/gif)")
    ap.add_argument("--grid-prompts", type=int, default=4, help="how many data.eval prompts the grid shows")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr_generator=1e-5")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(sys.argv[1:] if argv is None else argv)
    from flowrl.distill.config import load_config, prompt_list
    from flowrl.distill.trainer import DistillTrainer

    flags = ["run.resume=true"] * args.resume + ["run.restart=true"] * args.restart
    cfg = load_config(args.config, [*args.overrides, *flags])
    trainer = DistillTrainer(cfg)
    start = trainer.open_run_dir()
    logger = trainer.logger(resume_step=start - 1 if start else None)
    history = trainer.fit(args.iterations, logger)
    logger.close()
    out = {"start_step": start, "end_step": trainer.step, "last": history[-1] if history else {}}
    if args.sample and trainer.acc.is_main_process:
        from flowrl.distill.sample import write_stream

        with trainer.ema_student() as student:
            out["sample"] = write_stream(student, trainer.roles, cfg, prompt_list(cfg.data.train)[:1], args.sample)
    if args.grid and trainer.acc.is_main_process:
        from flowrl.distill.roles import build_roles
        from flowrl.distill.sample import eval_grid

        init = build_roles(cfg.model, critic=False).student.to(trainer.device)   # the student before distillation
        with trainer.ema_student() as student:
            out["grid"] = str(eval_grid({"init": init, "distilled (EMA)": student}, trainer.roles, cfg,
                                        prompt_list(cfg.data.eval)[: args.grid_prompts], args.grid))
    if trainer.acc.is_main_process:
        print(json.dumps(out, default=str))
    return out


if __name__ == "__main__":
    main()
