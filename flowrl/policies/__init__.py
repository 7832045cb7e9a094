"""Model policies: one file per family (sd3, flux, wan, wan22, toy), LoRA named adapters, EMA.

``POLICIES.get("sd3")`` imports the class on first use, so ``import flowrl.policies`` stays cheap
(no diffusers / transformers import).
"""
from flowrl.registry import Registry

POLICIES = Registry("policy", {
    "sd3": "flowrl.policies.sd3:SD3Policy",
    "flux": "flowrl.policies.flux:FluxPolicy",
    "wan": "flowrl.policies.wan:WanPolicy",
    "wan22": "flowrl.policies.wan22:Wan22Policy",
    "wan22_i2v": "flowrl.policies.wan22:Wan22I2VPolicy",
    "wan22_ti2v": "flowrl.policies.wan22:Wan22TI2VPolicy",
    "hunyuan15": "flowrl.policies.hunyuan15:HunyuanVideo15Policy",
    "toy": "flowrl.policies.toy:ToyPolicy",
})

__all__ = ["POLICIES"]
