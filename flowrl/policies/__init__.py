"""Model policies: one file per family (sd3, flux, flux2 + flux2_klein, zimage, wan, wan22, hunyuan15, ltx2, qwen_image,
qwen_image_edit[_plus], toy, toy_video), LoRA named adapters, EMA.

``POLICIES.get("sd3")`` imports the class on first use, so ``import flowrl.policies`` stays cheap
(no diffusers / transformers import).
"""
from flowrl.registry import Registry

POLICIES = Registry("policy", {
    "sd3": "flowrl.policies.sd3:SD3Policy",
    "flux": "flowrl.policies.flux:FluxPolicy",
    "flux2": "flowrl.policies.flux2:Flux2Policy",
    "flux2_klein": "flowrl.policies.flux2:Flux2KleinPolicy",
    "wan": "flowrl.policies.wan:WanPolicy",
    "zimage": "flowrl.policies.zimage:ZImagePolicy",
    "qwen_image": "flowrl.policies.qwen_image:QwenImagePolicy",
    "qwen_image_edit": "flowrl.policies.qwen_image_edit:QwenImageEditPolicy",
    "qwen_image_edit_plus": "flowrl.policies.qwen_image_edit:QwenImageEditPlusPolicy",
    "wan22": "flowrl.policies.wan22:Wan22Policy",
    "wan22_i2v": "flowrl.policies.wan22:Wan22I2VPolicy",
    "wan22_ti2v": "flowrl.policies.wan22:Wan22TI2VPolicy",
    "hunyuan15": "flowrl.policies.hunyuan15:HunyuanVideo15Policy",
    "ltx2": "flowrl.policies.ltx2:LTX2Policy",
    "toy": "flowrl.policies.toy:ToyPolicy",
    "toy_video": "flowrl.policies.toy_video:VideoToyPolicy",
})

__all__ = ["POLICIES"]
