"""Sharded checkpoints: every process writes its own shards with ``torch.distributed.checkpoint`` (DCP).

Layout of one sharded checkpoint (``run_dir/checkpoints/step_00000100/``, the store's atomic directory)::

    dcp/.metadata         DCP's index: every tensor's global size, dtype and which chunk lies in which file
    dcp/__<r>_0.distcp    process r's chunks of every tensor (weight sets, EMA shadow, optimizer moments)
    state.pt              the small state, written by the main process (as ``store.STATE_FILE``)
    manifest.json         ``"layout": "dcp"``, the world size, and sizes + sha256 of every file above; written last

Atomicity is the store's: the main process makes ``checkpoints/.tmp-step_…``, every process writes its shards
into it (DCP fsyncs each file), each process hashes the files it wrote (so no process reads all of them), the
main process writes state.pt and the manifest, then renames the directory into place. Processes agree on every
failure (``_agree``), so no process waits in a collective another has left.

Asynchronous (``save(asynchronous=True)``): the tensors are copied to CPU memory, written in a thread while
training goes on, and the checkpoint is completed (hashes, manifest, rename) by ``PendingSave.finish`` — at the
next save or at the end of the run (``resume.finish_saves``); a crash before that leaves only a ``.tmp-``.

Reading: ``load_into`` fills a state dict of DTensors (any process count: DCP's planner reads the chunks each
process needs, the resharding) or plain tensors; ``full_state`` rebuilds whole tensors on one process without a
process group (the 2 → 1 direction, the converter ``to_single_file``).
"""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import torch

from flowrl.checkpoint import store
from flowrl.checkpoint.store import MANIFEST_FILE, STATE_FILE, CheckpointError

LAYOUT = "dcp"
DCP_DIR = "dcp"


def rank_world() -> tuple[int, int]:
    """(rank, world) of the default process group, (0, 1) without one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_gather(obj) -> list:
    """``obj`` of every process, in rank order ([obj] without a process group)."""
    rank, world = rank_world()
    if world == 1:
        return [obj]
    out = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out


def _agree(error: str | None) -> None:
    """Raise the same CheckpointError on every process when any process reports an error."""
    errors = [e for e in all_gather(error) if e]
    if errors:
        raise CheckpointError(errors[0])


def _hashes(folder: Path, names: list[str], prefix: str = "") -> dict:
    """Manifest entries (bytes, sha256) of files ``names`` in ``folder``, keyed ``prefix + name``."""
    return {prefix + n: {"bytes": (folder / n).stat().st_size, "sha256": store._sha256(folder / n)} for n in names}


def save(run_dir: str | Path, step: int, tensors: dict, state: dict, keep_last: int | None = 3,
         asynchronous: bool = False) -> Path | None | PendingSave:
    """Write sharded checkpoint ``step`` (every process calls it; a collective); its directory on the main process,
    None on the others. ``tensors``: group → nested dict of DTensors / tensors (DCP keys: the dotted path);
    ``state``: the main process's weights_only-safe small state. ``asynchronous``: DCP copies the tensors to
    CPU memory and writes them in a thread (``dcp.async_save`` on its own gloo group); the returned
    ``PendingSave``'s ``finish()`` (every process) waits for the files, then hashes, writes the manifest and
    renames — until then the checkpoint does not exist."""
    import torch.distributed.checkpoint as dcp

    rank, world = rank_world()
    root = Path(run_dir) / store.CHECKPOINTS_DIR
    final = root / store.step_dir_name(step)
    tmp = root / f".tmp-{final.name}-{LAYOUT}"
    error = None
    if rank == 0:
        try:
            store._check_weights_only_safe(state)
            root.mkdir(parents=True, exist_ok=True)
            store._clean_stale(root)
            tmp.mkdir()
        except (CheckpointError, OSError) as e:
            error = f"cannot start checkpoint {final}: {e}"
    _agree(error)
    pending = PendingSave(Path(run_dir), tmp, final, step, sorted(tensors), state, keep_last)
    try:
        writer = dcp.FileSystemWriter(tmp / DCP_DIR)
        if asynchronous:
            pending.future = dcp.async_save(tensors, storage_writer=writer, process_group=_save_group())
            return pending
        dcp.save(tensors, storage_writer=writer)
    except BaseException:
        pending.discard()
        raise
    return pending.finish()


_SAVE_GROUP: list = []


def _save_group():
    """A gloo group for the asynchronous saves' collectives, apart from training's (made once, collectively)."""
    rank, world = rank_world()
    if world == 1:
        return None
    if not _SAVE_GROUP:
        _SAVE_GROUP.append(torch.distributed.new_group(backend="gloo"))
    return _SAVE_GROUP[0]


class PendingSave:
    """A sharded save whose shards are (being) written into its ``.tmp-`` directory; ``finish`` completes it."""

    def __init__(self, run_dir: Path, tmp: Path, final: Path, step: int, groups: list, state: dict,
                 keep_last: int | None):
        self.run_dir, self.tmp, self.final, self.step = run_dir, tmp, final, step
        self.groups, self.state, self.keep_last, self.future = groups, state, keep_last, None

    def discard(self) -> None:
        if rank_world()[0] == 0:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def finish(self) -> Path | None:
        """Every process: wait for the shards, hash its own, then the main process writes state.pt and the
        manifest and renames the directory into place; the checkpoint's path on the main process."""
        rank, world = rank_world()
        try:
            if self.future is not None:
                self.future.result()
            mine = sorted(n for n in os.listdir(self.tmp / DCP_DIR) if n.startswith(f"__{rank}_"))
            files = {k: v for part in all_gather(_hashes(self.tmp / DCP_DIR, mine, f"{DCP_DIR}/")) for k, v in
                     part.items()}
            error = None
            if rank == 0:
                try:
                    _finish(self.tmp, self.final, self.step, self.groups, self.state, files, world)
                except (CheckpointError, OSError) as e:
                    error = f"checkpoint {self.final}: {e}"
            _agree(error)
        except BaseException:
            self.discard()
            raise
        if rank != 0:
            return None
        if self.keep_last is not None:
            for _, old in store.list_checkpoints(self.run_dir)[:-self.keep_last]:
                store._remove_dir(old)
        return self.final


def _finish(tmp: Path, final: Path, step: int, groups: list, state: dict, files: dict, world: int) -> None:
    """Main process: state.pt, the manifest (written last), fsyncs, then the atomic rename into place."""
    import json
    import time

    torch.save(state, tmp / STATE_FILE)
    store._fsync_file(tmp / STATE_FILE)
    files = {**files, **_hashes(tmp / DCP_DIR, [".metadata"], f"{DCP_DIR}/"), **_hashes(tmp, [STATE_FILE])}
    manifest = {"format_version": store.FORMAT_VERSION, "step": step, "time": time.time(), "layout": LAYOUT,
                "world": world, "groups": groups, "files": files}
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    store._fsync_file(tmp / MANIFEST_FILE)
    store._fsync_dir(tmp / DCP_DIR)
    store._fsync_dir(tmp)
    if final.exists():
        store._remove_dir(final)
    os.rename(tmp, final)
    store._fsync_dir(final.parent)


def is_sharded_checkpoint(manifest: dict) -> bool:
    return manifest.get("layout") == LAYOUT


def verify(path: Path, manifest: dict, verify_hash: bool = True, collective: bool = True) -> None:
    """Sizes of every file on every process; each process hashes its share of the files; all agree. Not
    ``collective``: this process checks every file alone."""
    rank, world = rank_world() if collective else (0, 1)
    names = sorted(manifest["files"])
    mine = {n: manifest["files"][n] for n in names[rank::world]}
    error = None
    try:
        store._verify_files(path, {"files": {n: i for n, i in manifest["files"].items() if n not in mine}}, False)
        store._verify_files(path, {"files": mine}, verify_hash)
    except CheckpointError as e:
        if not collective:
            raise
        error = str(e)
    if collective:
        _agree(error)


def read_state(path: Path) -> dict:
    try:
        return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickler errors → one message naming the checkpoint
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {type(e).__name__}: {e}") from e


def load_into(path: Path, targets: dict) -> None:
    """Fill ``targets`` (group → nested dict of DTensors / tensors, as saved) in place from checkpoint ``path``;
    every process calls it. CheckpointError when a key is missing or a shape differs."""
    import torch.distributed.checkpoint as dcp

    try:
        dcp.load(targets, storage_reader=dcp.FileSystemReader(path / DCP_DIR))
    except Exception as e:    # DCP raises the same CheckpointException on every process
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit this run ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:300]})") from e


def full_state(path: Path) -> dict:
    """Every tensor of sharded checkpoint ``path`` whole on the CPU, nested as saved (group → name → ...); one
    process, no process group (DCP's reader with ``no_dist``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(path / DCP_DIR)
    try:
        meta = reader.read_metadata()
        flat = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.state_dict_metadata.items()
                if isinstance(m, TensorStorageMetadata)}
        with warnings.catch_warnings():      # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(flat, storage_reader=reader, no_dist=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: its DCP shards cannot be read ({type(e).__name__}: "
                              f"{e}); use an earlier checkpoint") from e
    nested: dict = {}
    for key, t in flat.items():
        *parents, leaf = meta.planner_data[key]
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = t
    return nested


def to_full(path: Path, manifest: dict, verify_hash: bool = True) -> tuple[dict, dict]:
    """``load_checkpoint``'s ``(tensors, state)`` of a sharded checkpoint: the weight groups whole, and the
    optimizer back in ``optimizer.state_dict()``'s layout (index keys), as an unsharded run's checkpoint has it;
    this process alone (no collective)."""
    verify(path, manifest, verify_hash, collective=False)
    state, full = read_state(path), full_state(path)
    tensors = {g: full.get(g, {}) for g in manifest["groups"] if g != "optimizer"}
    if "optimizer_names" in state:
        moments = full.get("optimizer", {})
        state["optimizer"] = {"state": {i: moments[n] for i, n in enumerate(state["optimizer_names"]) if n in moments},
                              "param_groups": state["optimizer_param_groups"]}
    return tensors, state


def to_single_file(checkpoint: str | Path, out_file: str | Path) -> Path:
    """Converter: any checkpoint (sharded or not) → one ``torch.save`` file ``{"step", "tensors", "state"}`` of full
    tensors, loadable with ``torch.load(weights_only=True)`` on one process."""
    path = store.resolve_checkpoint(checkpoint)
    tensors, state = store.load_checkpoint(path)
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"step": store.read_manifest(path)["step"], "tensors": tensors, "state": state}, out)
    return out
