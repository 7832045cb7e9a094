"""Reference (source) images of image-conditioned prompts: loaded from the paths a prompt file gives.

A prompt file line ``{"prompt": "make it blue", "image": "src/cat.png"}`` (or ``"images": [...]``) becomes the
prompt's metadata ``{"images": ["/abs/path/src/cat.png"]}`` (``flowrl.data.prompts``); ``source_images(metas)``
turns a batch's metadata into what ``Policy.encode(images=...)`` and ``RewardInput.images`` take: None when no row
has an image, else one entry per row, None or a list of float32 (3, H, W) tensors in [0, 1] (RGB, 8-bit / 255).
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

IMAGES_KEY = "images"


@lru_cache(maxsize=256)
def load_image(path: str) -> Tensor:
    """The image file ``path`` as a float32 (3, H, W) tensor in [0, 1] (RGB; alpha dropped)."""
    import numpy as np
    from PIL import Image

    if not Path(path).is_file():
        raise FileNotFoundError(f"source image not found: {path}")
    with Image.open(path) as im:
        arr = np.asarray(im.convert("RGB"), dtype=np.uint8).copy()
    return torch.from_numpy(arr).permute(2, 0, 1).float() / 255.0


def source_images(metas: Sequence[dict]) -> list[list[Tensor] | None] | None:
    """Each row's reference images (``meta["images"]`` paths), or None when no row carries one."""
    rows = [[load_image(p) for p in m.get(IMAGES_KEY) or []] or None for m in metas]
    return None if all(r is None for r in rows) else rows


def has_images(items: Sequence[tuple[str, dict]]) -> bool:
    """Whether any (prompt, meta) item of a prompt source carries reference images."""
    return any(m.get(IMAGES_KEY) for _, m in items)
