"""Checkpoints: atomic, verified storage of tensor groups + state (``store``), its sharded form where each process
writes its own chunks with torch.distributed.checkpoint (``sharded``), and the whole-run state an RL run saves and
restores for exact resume (``resume``).

Owns: the on-disk checkpoint format (``checkpoints/step_NNNNNN/{manifest.json, *.safetensors, state.pt}``; sharded
runs ``{manifest.json, state.pt, dcp/}``), atomic writes, rotation, RNG capture/restore, and what a run's checkpoint
contains.
"""
from flowrl.checkpoint.store import (
    CHECKPOINTS_DIR,
    MANIFEST_FILE,
    STATE_FILE,
    CheckpointError,
    capture_rng_state,
    incomplete_checkpoints,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_manifest,
    resolve_checkpoint,
    restore_rng_state,
    save_checkpoint,
    seed_global_rngs,
    step_dir_name,
)

__all__ = [
    "CHECKPOINTS_DIR", "MANIFEST_FILE", "STATE_FILE", "CheckpointError", "capture_rng_state",
    "incomplete_checkpoints", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "read_manifest",
    "resolve_checkpoint", "restore_rng_state", "save_checkpoint", "seed_global_rngs", "step_dir_name",
]
