"""Preference and demonstration datasets: one JSONL manifest, images beside it, latents cached per policy.

One record per line (paths relative to the manifest's folder; ``rejected`` absent for a demonstration set):

    {"prompt": "two red circles", "chosen": "images/000001_w.png", "rejected": "images/000001_l.png",
     "source": null, "meta": {...}, "chosen_score": 0.83, "rejected_score": 0.25, "nfe": 32}

- ``prompt`` (str) and ``chosen`` (path) are required; ``rejected`` is required by preference objectives (DPO);
- ``source``: an optional source image for edits (loaded and cached with the others; no shipped policy conditions on
  one yet);
- ``meta``: the prompt's metadata (the shapes world's spec), handed to the loop like a dataset prompt's;
- ``chosen_score`` / ``rejected_score``: optional; a record whose chosen score is below its rejected one is refused
  (verl-omni ``offline_dpo_dataset.py`` raises the same);
- ``nfe``: velocity evaluations spent making the record (every candidate sampled for it), 0 when unknown — the
  learning benchmark counts them as the offline method's rollout NFEs.

The format follows verl-omni's offline DPO rows (``prompt, img_win, img_lose, win_score, lose_score``) and keeps
Flow-Factory's rule that relative paths resolve against the manifest. Unlike Flow-Factory (which VAE-encodes every
step) and like verl-omni, latents are cached: ``cached_latents`` encodes every image once with
``policy.encode_pixels`` and keeps the tensors in ``<folder>/.latent_cache/<key>.pt``, the key a digest of the
policy's class, its weights' path and every image file's bytes.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

MANIFEST = "preferences.jsonl"
KEYS = {"prompt", "chosen", "rejected", "source", "meta", "chosen_score", "rejected_score", "nfe"}
IMAGE_KEYS = ("chosen", "rejected", "source")


@dataclass
class Record:
    prompt: str
    chosen: Path
    rejected: Path | None = None
    source: Path | None = None
    meta: dict = field(default_factory=dict)
    chosen_score: float | None = None
    rejected_score: float | None = None
    nfe: int = 0


def manifest_path(path: str | Path) -> Path:
    """The JSONL itself, or ``<folder>/preferences.jsonl``."""
    p = Path(path)
    p = p / MANIFEST if p.is_dir() else p
    if not p.is_file():
        raise ValueError(f"preference data {str(path)!r}: no such file (give a .jsonl or a folder with {MANIFEST})")
    return p


def parse_record(obj: dict, root: Path, where: str, need_rejected: bool) -> Record:
    """One manifest line → ``Record`` (paths resolved against ``root``); a one-line ValueError on bad input."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a record must be a JSON object")
    unknown = set(obj) - KEYS
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; a record has {sorted(KEYS)}")
    if not isinstance(obj.get("prompt"), str) or not obj.get("chosen"):
        raise ValueError(f"{where}: 'prompt' (a string) and 'chosen' (an image path) are required")
    if need_rejected and not obj.get("rejected"):
        raise ValueError(f"{where}: 'rejected' is required for preference training (DPO)")
    paths = {}
    for k in IMAGE_KEYS:
        if obj.get(k):
            paths[k] = (root / obj[k]).resolve()
            if not paths[k].is_file():
                raise ValueError(f"{where}: {k} image {obj[k]!r} not found (relative paths resolve against {root})")
    cs, rs = obj.get("chosen_score"), obj.get("rejected_score")
    if cs is not None and rs is not None and float(cs) < float(rs):
        raise ValueError(f"{where}: chosen_score {cs} < rejected_score {rs}; swap chosen and rejected")
    nfe = obj.get("nfe", 0)
    if not isinstance(nfe, int) or nfe < 0:
        raise ValueError(f"{where}: 'nfe' must be a non-negative integer, got {nfe!r}")
    score = (None if cs is None else float(cs), None if rs is None else float(rs))
    return Record(obj["prompt"], paths["chosen"], paths.get("rejected"), paths.get("source"),
                  dict(obj.get("meta") or {}), *score, nfe)


def read_records(path: str | Path, need_rejected: bool = True) -> list[Record]:
    """Every record of the manifest at ``path`` (a .jsonl or a folder); refuses an empty set."""
    m = manifest_path(path)
    out = []
    for n, line in enumerate(m.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{m}:{n}: not JSON ({e.msg})") from None
        out.append(parse_record(obj, m.parent, f"{m}:{n}", need_rejected))
    if not out:
        raise ValueError(f"{m}: no records")
    return out


def load_image(path: Path) -> Tensor:
    """(3, H, W) float32 in [0, 1]."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        arr = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous()


def save_image(pixels: Tensor, path: Path) -> None:
    """(3, H, W) in [0, 1] → an 8-bit PNG."""
    from PIL import Image

    arr = (pixels.detach().float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def _cache_key(policy, records: list[Record]) -> str:
    who = f"{type(policy).__module__}.{type(policy).__qualname__}|{getattr(policy, 'path', None)}"
    h = hashlib.sha256(who.encode())
    for r in records:
        for k in IMAGE_KEYS:
            p = getattr(r, k)
            h.update(k.encode() + (p.read_bytes() if p is not None else b"-"))
    return h.hexdigest()[:24]


@torch.no_grad()
def cached_latents(policy, records: list[Record], root: Path) -> dict[str, Tensor]:
    """{"chosen": (R, ...), "rejected": (R, ...) when every record has one, "source": likewise} latents, encoded
    once with ``policy.encode_pixels`` and cached under ``root/.latent_cache``."""
    encode = getattr(policy, "encode_pixels", None)
    if encode is None:
        raise ValueError(f"{type(policy).__name__} has no encode_pixels (image → latent); offline data needs one")
    cache = root / ".latent_cache" / f"{_cache_key(policy, records)}.pt"
    if cache.is_file():
        return torch.load(cache, map_location="cpu", weights_only=True)
    out = {}
    for k in IMAGE_KEYS:
        if all(getattr(r, k) is not None for r in records):
            dev = getattr(policy, "device", "cpu")
            out[k] = torch.cat([encode(load_image(getattr(r, k))[None].to(dev)).cpu() for r in records])
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    torch.save(out, tmp)
    tmp.replace(cache)
    return out


def write_manifest(records: list[dict], folder: Path) -> Path:
    """Write ``folder/preferences.jsonl`` (records as dicts with paths relative to ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MANIFEST
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
