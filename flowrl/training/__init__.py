"""The online-RL loop and its stages: rollout → reward → advantage → update → old-policy step, with evaluation,
logging and checkpoints around it.

``trainer.Trainer`` reads top to bottom; each stage is a module that takes only the objects it uses:
``parts`` (building every component from a ``RunConfig`` through the registries), ``update`` (the inner
optimisation), ``evaluation`` (held-out evaluation and grids), ``metrics_log`` (metrics.jsonl, TensorBoard, wandb).
"""
