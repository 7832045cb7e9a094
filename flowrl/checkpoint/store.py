"""Atomic checkpoints with everything exact resume needs.

Layout of one checkpoint (``run_dir/checkpoints/step_00000100/``)::

    <group>.safetensors   one file per tensor group (e.g. "train" LoRA weights, "ema"), float dtypes kept
    state.pt              every other piece of state (optimizer state_dict, step counters, window / data
                          position, balancer state, RNG states), loadable with torch.load(weights_only=True)
    manifest.json         step, file names, sizes and sha256 of each file; written last

Atomicity (the rule checkpoint-writing code in Flow-GRPO / Flow-Factory lacks): everything
is written into ``checkpoints/.tmp-step_…`` beside the target, each file and the directory are fsynced, and
only then is the directory renamed to ``step_…`` (``os.rename`` is atomic on POSIX). A crash at any point
leaves either the old set of checkpoints or the old set plus one complete new one; ``latest_checkpoint``
only ever returns a complete checkpoint (renamed into place and holding a manifest).

``state`` may contain only what ``torch.load(weights_only=True)`` accepts (tensors, numbers, strings, None,
lists, tuples, dicts, torch dtypes/devices/sizes); ``save_checkpoint`` checks this before writing and names
the offending key, so no checkpoint ever needs arbitrary unpickling to load.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from flowrl.errors import FlowRLError

__all__ = [
    "CheckpointError",
    "capture_rng_state",
    "incomplete_checkpoints",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "read_manifest",
    "resolve_checkpoint",
    "restore_rng_state",
    "save_checkpoint",
    "seed_global_rngs",
]

CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")
_GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_SAFE_LEAVES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


class CheckpointError(FlowRLError, RuntimeError):
    """A checkpoint that is missing, incomplete, corrupt, or state that cannot be saved safely."""


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


# ------------------------------------------------------------------------------------------ RNG state

def capture_rng_state(include_cuda: bool = True) -> dict:
    """This process's RNG states (python ``random``, numpy's global MT19937, torch CPU, torch CUDA when
    initialised) as weights_only-safe values; ``restore_rng_state`` of it makes the next draws repeat.

    numpy's state ``('MT19937', key uint32[624], pos, has_gauss, cached_gaussian)`` is stored with the key as
    an int64 tensor, python's ``(version, 625 ints, gauss_next)`` as a list.
    """
    import random

    import numpy as np

    version, internal, gauss_next = random.getstate()
    kind, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if include_cuda and torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def seed_global_rngs(seed: int) -> None:
    """Seed python's ``random``, numpy's global RNG and torch's (CPU and CUDA) from one seed, so two runs with
    the same ``run.seed`` hold the same global RNG states (and the same checkpointed ``rng``)."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def restore_rng_state(state: dict) -> None:
    """Inverse of ``capture_rng_state``; CUDA states are restored when both the state and CUDA have them."""
    import random

    import numpy as np

    try:
        py, npy = state["python"], state["numpy"]
        random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
        key = np.asarray(npy["key"].numpy() if isinstance(npy["key"], Tensor) else npy["key"], dtype=np.uint32)
        np.random.set_state((npy["kind"], key, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
        torch.set_rng_state(state["torch"].cpu())
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"RNG state is malformed ({type(e).__name__}: {e}); expected the dict "
                              "returned by flowrl.checkpoint.capture_rng_state()") from e
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            raise CheckpointError(f"RNG state holds {len(cuda)} CUDA generators but this process sees "
                                  f"{torch.cuda.device_count()} devices; resume with the same device count")
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


# ---------------------------------------------------------------------------------------------- saving

def _check_weights_only_safe(obj: Any, where: str = "state") -> None:
    """Raise CheckpointError naming the first value torch.load(weights_only=True) would refuse."""
    if isinstance(obj, Tensor):
        if type(obj) is not torch.Tensor and not isinstance(obj, torch.nn.Parameter):
            raise CheckpointError(f"{where}: tensor subclass {type(obj).__name__} is not weights_only-safe; "
                                  "store a plain tensor (t.detach().clone())")
        return
    if isinstance(obj, _SAFE_LEAVES):
        return
    if isinstance(obj, (dict, OrderedDict)):
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise CheckpointError(f"{where}: key {k!r} of type {type(k).__name__}; use str or int keys")
            _check_weights_only_safe(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        for i, v in enumerate(obj):
            _check_weights_only_safe(v, f"{where}[{i}]")
        return
    hint = " (numpy: convert with torch.from_numpy(a) or a.tolist(); numpy scalar: float(x))" \
        if type(obj).__module__.startswith("numpy") else " (convert it to tensors, numbers, lists or dicts)"
    raise CheckpointError(f"{where}: value of type {type(obj).__module__}.{type(obj).__qualname__} cannot be "
                          f"loaded with torch.load(weights_only=True){hint}")


def _cpu_unshared(group: str, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Detached contiguous CPU copies; tensors sharing storage are cloned (safetensors refuses shared memory)."""
    out, seen = {}, set()
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise CheckpointError(f"tensors[{group!r}][{name!r}] is a {type(t).__name__}, not a Tensor; "
                                  "put non-tensor values in `state`")
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if t.numel() and ptr in seen:
            t = t.clone()
        seen.add(ptr)
        out[name] = t
    return out


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def _write_contents(tmp: Path, step: int, tensors: Mapping[str, Mapping[str, Tensor]], state: dict) -> None:
    from safetensors.torch import save_file

    files = []
    for group, group_tensors in tensors.items():
        if not _GROUP_NAME.match(group) or group == "state":
            raise CheckpointError(f"tensor group name {group!r} is not a safe file name "
                                  "(letters, digits, '_', '.', '-'; not 'state')")
        path = tmp / f"{group}.safetensors"
        save_file(_cpu_unshared(group, group_tensors), str(path), metadata={"format": "pt", "step": str(step)})
        files.append(path)
    torch.save(state, tmp / STATE_FILE)
    files.append(tmp / STATE_FILE)
    manifest = {
        "format_version": FORMAT_VERSION, "step": step, "time": time.time(),
        "groups": sorted(tensors),
        "files": {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files},
    }
    for p in files:
        _fsync_file(p)
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    _fsync_file(tmp / MANIFEST_FILE)
    _fsync_dir(tmp)


def _remove_dir(path: Path) -> None:
    """Rename out of the ``step_*`` namespace first, so a crash mid-delete never leaves a half ``step_*``."""
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}-{time.monotonic_ns()}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _clean_stale(ckpt_root: Path) -> None:
    for p in ckpt_root.iterdir():
        if p.name.startswith((".tmp-", ".trash-")) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(run_dir: str | Path, step: int, tensors: Mapping[str, Mapping[str, Tensor]] | None = None,
                    state: dict | None = None, keep_last: int | None = 3) -> Path:
    """Write checkpoint ``step`` atomically under ``run_dir/checkpoints/`` and return its directory.

    tensors: group name → {parameter name → tensor}, each group one safetensors file (moved to CPU).
    state:   everything else (weights_only-safe values only; checked before anything is written).
    keep_last: after a successful write, delete all but the newest ``keep_last`` checkpoints (None: keep all).
    Re-saving an existing step replaces it (the old one stays valid until the new one is in place).
    """
    if not isinstance(step, int) or step < 0:
        raise CheckpointError(f"checkpoint step must be a non-negative int, got {step!r}")
    if keep_last is not None and keep_last < 1:
        raise CheckpointError(f"keep_last must be >= 1 or None, got {keep_last}")
    tensors, state = dict(tensors or {}), dict(state or {})
    _check_weights_only_safe(state)
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    _clean_stale(root)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    tmp.mkdir()
    try:
        _write_contents(tmp, step, tensors, state)
        if final.exists():
            _remove_dir(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last is not None:
        for _, old in list_checkpoints(run_dir)[:-keep_last]:
            _remove_dir(old)
    return final


# --------------------------------------------------------------------------------------------- loading

def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints ``(step, path)`` under ``run_dir/checkpoints``, oldest first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / MANIFEST_FILE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def incomplete_checkpoints(run_dir: str | Path) -> list[Path]:
    """``step_*`` directories of a run without a manifest, oldest first. ``save_checkpoint`` renames a directory
    into place only after its manifest is written, so these are damaged (files deleted or lost), never a save
    that was interrupted (that leaves a ``.tmp-step_*`` directory, ignored and cleaned up)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    bad = [(int(m.group(1)), p) for p in root.iterdir()
           if (m := _STEP_DIR.match(p.name)) and p.is_dir() and not (p / MANIFEST_FILE).is_file()]
    return [p for _, p in sorted(bad)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint directory of a run, or None when it has none."""
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1][1] if ckpts else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from either itself, a run dir (its latest) or a run's ``checkpoints/`` dir."""
    p = Path(path)
    if (p / MANIFEST_FILE).is_file():
        return p
    for run_dir in (p, p.parent if p.name == CHECKPOINTS_DIR else None):
        if run_dir is not None and (latest := latest_checkpoint(run_dir)) is not None:
            return latest
    if not p.exists():
        raise CheckpointError(f"checkpoint path {str(p)!r} does not exist")
    raise CheckpointError(f"{str(p)!r} is neither a checkpoint (no {MANIFEST_FILE}: incomplete or not written by "
                          "flowrl.checkpoint) nor a run directory containing checkpoints/step_*")


def read_manifest(path: str | Path) -> dict:
    """The manifest of checkpoint directory ``path`` (step, groups, file sizes and hashes)."""
    p = Path(path)
    mf = p / MANIFEST_FILE
    if not p.is_dir():
        raise CheckpointError(f"checkpoint {str(p)!r} does not exist or is not a directory")
    if not mf.is_file():
        raise CheckpointError(f"checkpoint {str(p)!r} has no {MANIFEST_FILE}: it is incomplete or was not "
                              "written by flowrl.checkpoint.save_checkpoint")
    try:
        manifest = json.loads(mf.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {str(p)!r}: {MANIFEST_FILE} is corrupt ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        version = manifest.get("format_version") if isinstance(manifest, dict) else None
        raise CheckpointError(f"checkpoint {str(p)!r}: format_version {version!r}, this flowrl reads "
                              f"{FORMAT_VERSION}")
    _check_manifest(mf, manifest)
    return manifest


def _check_manifest(path: Path, manifest: dict) -> None:
    """CheckpointError naming ``path`` unless the manifest has ``step``, ``groups`` and ``files`` of the shapes
    ``_write_contents`` writes (a hand-edited or truncated manifest would otherwise fail with a KeyError)."""
    def fail(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint manifest {str(path)!r}: {what}; the checkpoint is damaged, use an "
                               "earlier one")

    for key, kind in (("step", int), ("groups", list), ("files", dict)):
        if key not in manifest:
            raise fail(f"no '{key}' entry")
        if not isinstance(manifest[key], kind):
            raise fail(f"'{key}' is a {type(manifest[key]).__name__}, expected a {kind.__name__}")
    for name, info in manifest["files"].items():
        if not (isinstance(info, dict) and isinstance(info.get("bytes"), int) and isinstance(info.get("sha256"), str)):
            raise fail(f"files[{name!r}] needs 'bytes' (int) and 'sha256' (str), got {info!r}")
    if manifest.get("layout") == "dcp":                      # flowrl.checkpoint.sharded: groups live in dcp/
        needed = [f for f in ("dcp/.metadata", STATE_FILE) if f not in manifest["files"]]
    else:
        needed = [f"{g}.safetensors" for g in manifest["groups"] if f"{g}.safetensors" not in manifest["files"]]
        needed += [STATE_FILE] if STATE_FILE not in manifest["files"] else []
    if needed:
        raise fail(f"'files' does not list {needed}")


def _verify_files(p: Path, manifest: dict, verify_hash: bool) -> None:
    for name, info in manifest["files"].items():
        f = p / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {str(p)!r}: file {name} listed in the manifest is missing")
        if f.stat().st_size != info["bytes"]:
            raise CheckpointError(f"checkpoint {str(p)!r}: {name} has {f.stat().st_size} bytes, manifest says "
                                  f"{info['bytes']} (truncated or overwritten); use an earlier checkpoint")
        if verify_hash and _sha256(f) != info["sha256"]:
            raise CheckpointError(f"checkpoint {str(p)!r}: {name} fails its sha256 check (corrupt); "
                                  "use an earlier checkpoint")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", verify: bool = True
                    ) -> tuple[dict[str, dict[str, Tensor]], dict]:
    """Load ``(tensors, state)`` from a checkpoint dir (or a run dir: its latest checkpoint).

    Files are checked against the manifest (sizes always, sha256 when ``verify``); ``state.pt`` is read with
    ``torch.load(weights_only=True)``. Raises CheckpointError naming the problem on any mismatch. A sharded (DCP)
    checkpoint is read whole on this process (``flowrl.checkpoint.sharded.to_full``).
    """
    from safetensors.torch import load_file

    p = resolve_checkpoint(path)
    manifest = read_manifest(p)
    if manifest.get("layout") == "dcp":
        from flowrl.checkpoint.sharded import to_full

        return to_full(p, manifest, verify)
    _verify_files(p, manifest, verify)
    device = str(map_location)
    try:
        tensors = {g: load_file(str(p / f"{g}.safetensors"), device=device) for g in manifest["groups"]}
        state = torch.load(p / STATE_FILE, map_location=map_location, weights_only=True)
    except Exception as e:  # safetensors / unpickler errors → one message naming the checkpoint
        raise CheckpointError(f"checkpoint {str(p)!r} cannot be read: {type(e).__name__}: {e}") from e
    return tensors, state
