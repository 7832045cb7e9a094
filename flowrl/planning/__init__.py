"""Memory planning before launch: will a run's config fit on N GPUs of G GiB (``scripts/plan.py``, docs/memory.md).

``plan(cfg, gpus, gpu_mem)`` → ``Plan``: per-process bytes of every weight set, gradients, AdamW state, EMA, text
encoders / VAE, stored samples and an activation estimate, the predicted peak, the verdict and the predicted
effect of each remedy. Parameters come from the published transformer config instantiated on the meta device
(``models``); activations from a measured probe on the family's tiny model, scaled by dimensions (``activations``).
"""
from flowrl.planning.budget import Plan, plan

__all__ = ["Plan", "plan"]
