"""The remote-reward wire format, shared by ``rewards.server`` and the ``remote`` client.

Request  ``POST /score`` with ``Authorization: Bearer <token>`` and an ``.npz`` body (``numpy.savez``,
read back with ``allow_pickle=False``) holding
    pixels     uint8 (0–255) or float16/float32 (0–1), (B, 3, H, W) or (B, F, 3, H, W)
    group_ids  int64 (B,)
    info       uint8 bytes of UTF-8 JSON {"prompts": [B str], "meta": [B dict] or [], "images": [B] (optional)}
    source_<j> uint8 (3, H, W), the prompts' source images (``RewardInput.images``) when any: ``info.images[b]`` is
               the list of j's of row b's sources, or null for a row without one
Reply ``200`` JSON ``{"reward": name, "scores": {"score": [B], "<aspect>": [B]}}`` (NaN sent as null), or
``4xx/5xx`` JSON ``{"error": reason}``.  Arrays are read member by member from their .npy headers, with a cap on
the bytes they unpack to (``decode_request(max_unpacked=...)``), so compressed members (``numpy.savez_compressed``)
are accepted but cannot inflate past the cap.
"""
from __future__ import annotations

import io
import json
import math
import zipfile

import numpy as np
import torch
from numpy.lib import format as npformat
from torch import Tensor

from rewards.base import RewardInput

CONTENT_TYPE = "application/x-npz"


class WireError(ValueError):
    """A request body that does not follow the format; the message is sent back with a 400."""


class WireTooLarge(WireError):
    """A request body whose arrays would unpack to more bytes than allowed; the server answers 413."""


def encode_request(batch: RewardInput, pixel_format: str = "uint8") -> bytes:
    """The .npz body for ``batch``; ``pixel_format`` "uint8" (4× smaller, 1/255 steps) or "float32"."""
    px = batch.pixels.detach().float().cpu()
    if pixel_format == "uint8":
        arr = (px * 255).round().clamp(0, 255).to(torch.uint8).numpy()
    elif pixel_format in ("float32", "float16"):
        arr = px.numpy().astype(pixel_format)
    else:
        raise ValueError(f"pixel_format must be 'uint8', 'float16' or 'float32', got {pixel_format!r}")
    fields, sources = {"prompts": list(batch.prompts), "meta": list(batch.meta)}, {}
    if batch.images is not None:
        fields["images"] = []
        for row in batch.images:
            ids = [len(sources) + k for k in range(len(row or []))]
            for j, img in zip(ids, row or [], strict=True):
                u8 = (img.detach().float().cpu() * 255).round().clamp(0, 255).to(torch.uint8)
                sources[f"source_{j}"] = u8.numpy()
            fields["images"].append(ids or None)
    info = json.dumps(fields).encode()
    buf = io.BytesIO()
    np.savez(buf, pixels=arr, group_ids=batch.group_ids.cpu().numpy().astype(np.int64),
             info=np.frombuffer(info, dtype=np.uint8), **sources)
    return buf.getvalue()


def _read_member(zf: zipfile.ZipFile, name: str, budget: int) -> tuple[np.ndarray, int]:
    """Array ``name`` of the archive and its size in bytes, refused before decompression when its .npy header
    asks for more than ``budget`` bytes; reads (and so inflates) at most that many bytes."""
    try:
        info = zf.getinfo(f"{name}.npy")
    except KeyError:
        raise WireError(f"body lacks array {name!r}") from None
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise WireError(f"array {name!r} must be stored or deflated (numpy.savez / savez_compressed), "
                        f"got zip compression type {info.compress_type}")
    with zf.open(info) as f:
        version = npformat.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise WireError(f"array {name!r}: .npy format version {version} is not supported (1.0 or 2.0)")
        read_header = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        if any(d < 0 for d in shape):
            raise WireError(f"array {name!r} has a negative dimension in its shape {shape}")
        if dtype.hasobject:
            raise WireError(f"array {name!r} holds Python objects; only plain numeric arrays are accepted")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > budget:
            raise WireTooLarge(f"array {name!r} {tuple(shape)} {dtype} unpacks to {nbytes} bytes, over the "
                               f"{budget} left of the limit on unpacked bytes")
        data = f.read(nbytes)
    if len(data) != nbytes:
        raise WireError(f"array {name!r} is truncated: {len(data)} of {nbytes} bytes")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C"), nbytes


def _unpack(body: bytes, max_unpacked: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """(pixels, group_ids, info, {source_<j>: array}) of an .npz body, at most ``max_unpacked`` bytes in total."""
    left, arrays = max_unpacked, []
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as zf:
            sources = sorted(n[:-4] for n in zf.namelist() if n.startswith("source_") and n.endswith(".npy"))
            for name in ("pixels", "group_ids", "info", *sources):
                arr, nbytes = _read_member(zf, name, left)
                arrays.append(arr)
                left -= nbytes
    except WireError:
        raise
    except Exception as e:  # not a zip, a bad .npy header, a corrupt deflate stream...
        raise WireError(f"body is not a valid .npz of plain arrays: {type(e).__name__}: {e}") from e
    return (*arrays[:3], dict(zip(sources, arrays[3:], strict=True)))


def _source_images(listing, sources: dict, n: int) -> list | None:
    """``info.images`` + the source_<j> arrays → ``RewardInput.images`` (float32 (3, H, W) in [0, 1])."""
    if listing is None:
        return None
    if not (isinstance(listing, list) and len(listing) == n):
        raise WireError(f"info.images must list one entry (null or a list of source ids) per prompt, {n} in all")
    rows = []
    for ids in listing:
        if ids is not None and not (isinstance(ids, list) and all(f"source_{j}" in sources for j in ids)):
            raise WireError(f"info.images entry {ids!r} names sources the body does not hold")
        imgs = [sources[f"source_{j}"] for j in ids or []]
        if any(a.dtype != np.uint8 or a.ndim != 3 or a.shape[0] != 3 for a in imgs):
            raise WireError("each source_<j> must be a uint8 (3, H, W) array")
        rows.append([torch.from_numpy(a.astype(np.float32) / 255.0) for a in imgs] or None)
    return rows


def decode_request(body: bytes, max_unpacked: int = 1 << 31) -> RewardInput:
    """Parse and validate an .npz body into a ``RewardInput`` (pixels float32 in [0, 1]); WireError if bad.

    Decompression is bounded: each array's .npy header is read first and the arrays may hold at most
    ``max_unpacked`` bytes together (else ``WireTooLarge``), so a small compressed "zip bomb" is refused
    before it is inflated; only stored or deflated members are read, and never more bytes than their header
    declares."""
    pixels, group_ids, info, sources = _unpack(body, max_unpacked)
    if pixels.dtype == np.uint8:
        px = torch.from_numpy(pixels.astype(np.float32) / 255.0)
    elif pixels.dtype in (np.float16, np.float32):
        px = torch.from_numpy(pixels.astype(np.float32))
    else:
        raise WireError(f"pixels must be uint8 or float16/float32, got {pixels.dtype}")
    try:
        meta = json.loads(info.astype(np.uint8).tobytes().decode())
        prompts, extra, listing = meta["prompts"], meta.get("meta", []), meta.get("images")
    except Exception as e:
        raise WireError(f"info must be UTF-8 JSON with a 'prompts' list: {e}") from e
    if not (isinstance(prompts, list) and all(isinstance(p, str) for p in prompts)):
        raise WireError("info.prompts must be a list of strings")
    if not (isinstance(extra, list) and all(isinstance(m, dict) for m in extra)):
        raise WireError("info.meta must be a list of objects")
    if group_ids.dtype.kind not in "iu" or group_ids.ndim != 1:
        raise WireError(f"group_ids must be a 1-d integer array, got {group_ids.dtype} {group_ids.shape}")
    return RewardInput(pixels=px, prompts=prompts, group_ids=torch.from_numpy(group_ids.astype(np.int64)),
                       meta=extra, images=_source_images(listing, sources, len(prompts)))


def encode_scores(name: str, scores: dict[str, Tensor]) -> bytes:
    """JSON reply; NaN → null."""
    body = {k: [None if math.isnan(x) else x for x in v.tolist()] for k, v in scores.items()}
    return json.dumps({"reward": name, "scores": body}).encode()


def decode_scores(data: bytes) -> dict[str, Tensor]:
    """{key: (B,) float32} from a JSON reply; null → NaN."""
    body = json.loads(data)["scores"]
    return {k: torch.tensor([math.nan if x is None else float(x) for x in v], dtype=torch.float32)
            for k, v in body.items()}
