"""The online-RL loop and its stages: rollout → reward → advantage → update → old-policy step, with evaluation,
logging and checkpoints around it.

``trainer.Trainer`` reads top to bottom; each stage is a module that takes only the objects it uses:
``rollout`` (samples with the "old" adapter, flat or tree; ``pool`` in front of it), ``scoring`` (rewards),
``advantage`` (balancer → objective mapping), ``update`` (the inner optimisation and the balancers' gradient
service), ``evaluation`` (held-out evaluation, detectors, drift alarms). ``parts`` builds every component from a
``RunConfig`` through the registries; ``state`` holds the counters; ``metrics_log`` writes metrics.jsonl,
TensorBoard and wandb.
"""
