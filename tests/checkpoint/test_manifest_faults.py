"""Damaged checkpoints are CheckpointErrors naming the file (issue #16 item 1): a manifest without ``files`` or
``groups`` (raw KeyError before), a checkpoint without the ``train`` tensor group or a state entry the run needs
(raw KeyError in resume), one that does not fit the run (e.g. another LoRA rank), and step directories that
lost their manifest (listed as damaged, never taken for complete ones)."""
import json
from types import SimpleNamespace

import pytest
import torch

from flowrl.checkpoint import CheckpointError, incomplete_checkpoints, latest_checkpoint, load_checkpoint
from flowrl.checkpoint import save_checkpoint as save
from flowrl.checkpoint.resume import RunState, restore

STATE = {"optimizer": {}, "loop": {}, "balancer": {}, "window": {}, "rng": {}}


def edit_manifest(path, change):
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("key", ["files", "groups", "step"])
def test_manifest_missing_an_entry(tmp_path, key):
    path = save(tmp_path, 1, {"train": {"w": torch.ones(2)}}, {})
    edit_manifest(path, lambda m: m.pop(key))
    with pytest.raises(CheckpointError, match=rf"manifest '{path / 'manifest.json'}': no '{key}' entry"):
        load_checkpoint(path)


def test_manifest_entries_of_the_wrong_shape(tmp_path):
    path = save(tmp_path, 1, {"train": {"w": torch.ones(2)}}, {})
    edit_manifest(path, lambda m: m["files"].update({"state.pt": {"bytes": "12"}}))
    with pytest.raises(CheckpointError, match=r"files\['state.pt'\] needs 'bytes'"):
        load_checkpoint(path)
    edit_manifest(path, lambda m: m.update(files={"state.pt": {"bytes": 1, "sha256": "x"}}))
    with pytest.raises(CheckpointError, match=r"'files' does not list \['train.safetensors'\]"):
        load_checkpoint(path)


class Policy:
    """The two weight sets of a LoRA run; loading raises what torch raises for another adapter shape."""

    def weight_sets(self):
        return ["train", "old"]

    def load_adapter_state_dict(self, state, name):
        raise RuntimeError("size mismatch for w: copying a param with shape [2] into shape [4]")


def run_state(ema=None):
    return RunState(policy=Policy(), optimizer=None, ema=ema, balancer_state={}, objective_state={}, window=None,
                    loop=SimpleNamespace())


def test_groups_without_train_is_a_checkpoint_error_naming_the_file(tmp_path):
    path = save(tmp_path, 1, {"old": {"w": torch.ones(2)}}, STATE)
    with pytest.raises(CheckpointError, match=rf"checkpoint '{path}' has no tensor group 'train' \(groups: \['old'\]"):
        restore(path, run_state())


def test_state_without_an_entry_the_run_needs(tmp_path):
    path = save(tmp_path, 1, {"train": {"w": torch.ones(2)}, "old": {"w": torch.ones(2)}},
                {k: v for k, v in STATE.items() if k != "rng"})
    with pytest.raises(CheckpointError, match=r"state.pt has no 'rng' entry"):
        restore(path, run_state())


def test_a_checkpoint_that_does_not_fit_the_run(tmp_path):
    path = save(tmp_path, 1, {"train": {"w": torch.ones(2)}, "old": {"w": torch.ones(2)}}, STATE)
    with pytest.raises(CheckpointError, match=r"does not fit this run \(RuntimeError: size mismatch"):
        restore(path, run_state())


def test_step_directories_without_a_manifest_are_listed_as_damaged(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step, {"train": {"w": torch.ones(2)}}, {}, keep_last=None)
    for step in (1, 3):
        (tmp_path / "checkpoints" / f"step_{step:08d}" / "manifest.json").unlink()
    assert [p.name for p in incomplete_checkpoints(tmp_path)] == ["step_00000001", "step_00000003"]
    assert latest_checkpoint(tmp_path).name == "step_00000002"
