"""transformers CLIP plumbing shared by PickScore and the aesthetic predictor (imported only inside setup).

Loading is ``CLIPModel.from_pretrained`` / ``AutoProcessor.from_pretrained`` on a hub id or a local dir; images
are preprocessed with the processor's own geometry and statistics, but as batched torch ops
(``rewards.preprocess.clip_preprocess``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from rewards.preprocess import clip_preprocess, quantize_uint8

_MODES = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL resample codes


def load_clip(model_path: str, processor_path: str, device: torch.device, dtype: torch.dtype):
    """(CLIPModel in eval mode on device/dtype, processor) from hub ids or local directories."""
    from transformers import AutoProcessor, CLIPModel

    model = CLIPModel.from_pretrained(model_path).eval().to(device=device, dtype=dtype)
    model.requires_grad_(False)
    return model, AutoProcessor.from_pretrained(processor_path)


def _size_of(value, *keys) -> int | tuple[int, int]:
    get = (lambda k: value.get(k)) if isinstance(value, dict) else (lambda k: getattr(value, k, None))
    for k in keys:
        if get(k):
            return get(k)
    if get("height") and get("width"):
        return (get("height"), get("width"))
    raise ValueError(f"cannot read an image size from {value!r}")


def processor_geometry(processor) -> dict:
    """{size, crop, mean, std, mode} of a CLIP image processor (shortest-edge resize + center crop)."""
    ip = getattr(processor, "image_processor", processor)
    size = _size_of(ip.size, "shortest_edge")
    size = size if isinstance(size, int) else min(size)
    crop = _size_of(ip.crop_size, "shortest_edge") if getattr(ip, "do_center_crop", True) else size
    crop = (crop, crop) if isinstance(crop, int) else tuple(crop)
    resample = getattr(ip, "resample", 3)
    mode = _MODES.get(int(resample) if not isinstance(resample, str) else 3, "bicubic")
    return {"size": size, "crop": crop, "mean": tuple(ip.image_mean), "std": tuple(ip.image_std), "mode": mode}


def pixel_values(pixels: Tensor, geometry: dict, quantize: bool, dtype: torch.dtype) -> Tensor:
    """The CLIP input (B, 3, crop_h, crop_w) for float pixels in [0, 1]."""
    x = quantize_uint8(pixels) if quantize else pixels
    out = clip_preprocess(x, geometry["size"], geometry["crop"], geometry["mean"], geometry["std"],
                          geometry["mode"])
    return out.to(dtype)


def _pooled(out) -> Tensor:
    """transformers ≥5 returns a model output whose pooler_output is the projected embedding; ≤4 a tensor."""
    return out if isinstance(out, Tensor) else out.pooler_output


def image_embeds(model, pixel_values: Tensor) -> Tensor:
    """L2-normalised projected image embeddings (B, D)."""
    e = _pooled(model.get_image_features(pixel_values=pixel_values)).float()
    return e / e.norm(dim=-1, keepdim=True)


def text_embeds(model, tokenizer, prompts: list[str], max_length: int, device: torch.device) -> Tensor:
    """L2-normalised projected text embeddings (B, D); tokens padded to the longest, truncated at ``max_length``."""
    tok = tokenizer(prompts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    tok = {k: v.to(device) for k, v in tok.items() if k in ("input_ids", "attention_mask")}
    e = _pooled(model.get_text_features(**tok)).float()
    return e / e.norm(dim=-1, keepdim=True)
