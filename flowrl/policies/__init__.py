"""Model policies: one file per family (sd3, flux, wan, toy, toy_video), LoRA named adapters, EMA.

``POLICIES.get("sd3")`` imports the class on first use, so ``import flowrl.policies`` stays cheap
(no diffusers / transformers import).
"""
from flowrl.registry import Registry

POLICIES = Registry("policy", {
    "sd3": "flowrl.policies.sd3:SD3Policy",
    "flux": "flowrl.policies.flux:FluxPolicy",
    "wan": "flowrl.policies.wan:WanPolicy",
    "toy": "flowrl.policies.toy:ToyPolicy",
    "toy_video": "flowrl.policies.toy_video:VideoToyPolicy",
})

__all__ = ["POLICIES"]
