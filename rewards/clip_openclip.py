"""open_clip plumbing shared by HPSv2, CLIPScore and temporal consistency (imported only inside setup).

``load_open_clip`` creates an architecture by name (``open_clip.create_model``; a JSON ``model_config`` file
registers a custom architecture first) and loads weights from an open_clip pretrained tag, a local file, or
``hf-hub:<org>/<repo>/<file>``; a checkpoint dict may hold the weights under ``state_dict`` (HPSv2 format).
"""
from __future__ import annotations

import torch
from torch import Tensor

from rewards.preprocess import clip_preprocess


def _checkpoint_state(path: str, key: str | None) -> dict:
    from rewards.aesthetic import resolve_file

    ckpt = torch.load(resolve_file(path, "open_clip checkpoint"), map_location="cpu", weights_only=True)
    if key:
        if key not in ckpt:
            raise KeyError(f"checkpoint {path!r} has no {key!r} entry (keys: {sorted(ckpt)[:8]})")
        ckpt = ckpt[key]
    return {k.removeprefix("module."): v for k, v in ckpt.items()}


def load_open_clip(model_name: str, pretrained: str | None, checkpoint: str | None, checkpoint_key: str | None,
                   model_config: str | None, device: torch.device, dtype: torch.dtype):
    """(open_clip model in eval mode, tokenizer).  ``pretrained``: open_clip tag or file, loaded by open_clip;
    ``checkpoint``: a further state dict loaded strictly on top (e.g. HPS_v2.1_compressed.pt)."""
    import open_clip

    if model_config:
        open_clip.add_model_config(model_config)
    if open_clip.get_model_config(model_name) is None and not model_name.startswith("hf-hub:"):
        raise ValueError(f"unknown open_clip architecture {model_name!r}; give model_config=<file.json> "
                         f"for a custom one (e.g. ViT-H-14, ViT-L-14 are built in)")
    model = open_clip.create_model(model_name, pretrained=pretrained or None)
    if checkpoint:
        model.load_state_dict(_checkpoint_state(checkpoint, checkpoint_key), strict=True)
    model = model.eval().to(device=device, dtype=dtype)
    model.requires_grad_(False)
    return model, open_clip.get_tokenizer(model_name)



def load_open_clip_from(cfg, device: torch.device, dtype: torch.dtype):
    """:func:`load_open_clip` with the five loading fields every open_clip reward's ``Config`` carries
    (``model_name``, ``pretrained``, ``checkpoint``, ``checkpoint_key``, ``model_config``)."""
    return load_open_clip(cfg.model_name, cfg.pretrained, cfg.checkpoint, cfg.checkpoint_key, cfg.model_config,
                          device, dtype)

class OpenClipReward:
    """The life cycle the open_clip rewards share: ``cfg`` (the class's ``Config``), and on ``setup`` the model,
    its tokenizer, device and dtype (open_clip itself is imported only then)."""

    Config: type
    accepts = ("image",)

    def __init__(self, cfg=None):
        self.cfg = cfg or self.Config()
        self.model = None

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.tokenizer = load_open_clip_from(self.cfg, device, dtype)
        self.device, self.dtype = device, dtype


def preprocess_cfg(model) -> dict:
    """{size, mean, std, mode} of an open_clip model's eval transform."""
    cfg = dict(getattr(model.visual, "preprocess_cfg", {}) or {})
    size = cfg.get("size", model.visual.image_size)
    size = size if isinstance(size, int) else tuple(size)
    return {"size": size, "mean": tuple(cfg.get("mean", (0.48145466, 0.4578275, 0.40821073))),
            "std": tuple(cfg.get("std", (0.26862954, 0.26130258, 0.27577711))),
            "mode": cfg.get("interpolation", "bicubic")}


def clip_pixels(model, pixels: Tensor, dtype: torch.dtype) -> Tensor:
    """open_clip's eval transform (shortest side resize, center crop, normalise) as batched torch ops."""
    p = preprocess_cfg(model)
    size = p["size"] if isinstance(p["size"], tuple) else (p["size"], p["size"])
    return clip_preprocess(pixels, min(size), size, p["mean"], p["std"], p["mode"]).to(dtype)


def encode_images(model, pixel_values: Tensor) -> Tensor:
    """L2-normalised image embeddings (B, D), float32."""
    e = model.encode_image(pixel_values).float()
    return e / e.norm(dim=-1, keepdim=True)


def encode_texts(model, tokenizer, prompts: list[str], device: torch.device) -> Tensor:
    """L2-normalised text embeddings (B, D), float32."""
    e = model.encode_text(tokenizer(prompts).to(device)).float()
    return e / e.norm(dim=-1, keepdim=True)
