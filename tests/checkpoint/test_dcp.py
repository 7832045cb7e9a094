"""Sharded (DCP) checkpoints on one process (``flowrl.checkpoint.sharded``; the two-process runs are in
tests/trainer/test_fsdp_dcp.py): the layout and manifest, whole-tensor reads through ``load_checkpoint`` and the
single-file converter, and damaged or partial checkpoints refused or skipped with the file named."""
import json

import pytest
import torch

from flowrl.checkpoint import (
    CheckpointError,
    incomplete_checkpoints,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_manifest,
    sharded,
)

NAMES = ["blocks.0.w", "blocks.1.w"]


def tensors():
    g = torch.Generator().manual_seed(0)
    train = {n: torch.randn(4, 3, generator=g) for n in NAMES}
    optimizer = {n: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 3, generator=g)} for n in NAMES}
    return {"train": train, "ema": {"00000": torch.randn(2, generator=g).double()}, "optimizer": optimizer}


STATE = {"loop": {"iteration": 3}, "optimizer_names": NAMES, "rng_ranks": [{"torch": torch.zeros(2)}],
         "optimizer_param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0, 1]}]}


@pytest.fixture
def ckpt(tmp_path):
    with pytest.warns(UserWarning):          # DCP: no process group, "assuming ... a single process"
        return sharded.save(tmp_path, 3, tensors(), STATE, keep_last=None)


def test_layout_and_manifest(ckpt):
    manifest = read_manifest(ckpt)
    assert manifest["layout"] == "dcp" and manifest["world"] == 1 and manifest["step"] == 3
    assert set(manifest["files"]) == {"dcp/.metadata", "dcp/__0_0.distcp", "state.pt"}
    assert manifest["groups"] == ["ema", "optimizer", "train"]
    assert not [p for p in ckpt.parent.iterdir() if p.name.startswith(".tmp-")]


def test_whole_tensors_and_the_optimizer_in_state_dict_layout(ckpt, tmp_path):
    want = tensors()
    got, state = load_checkpoint(ckpt)
    assert sorted(got) == ["ema", "train"]
    assert all(torch.equal(got["train"][n], want["train"][n]) for n in NAMES)
    assert got["ema"]["00000"].dtype == torch.float64 and torch.equal(got["ema"]["00000"], want["ema"]["00000"])
    opt = state["optimizer"]
    assert opt["param_groups"] == STATE["optimizer_param_groups"] and sorted(opt["state"]) == [0, 1]
    assert all(torch.equal(opt["state"][i]["exp_avg"], want["optimizer"][n]["exp_avg"]) for i, n in enumerate(NAMES))
    assert state["loop"] == {"iteration": 3}
    single = torch.load(sharded.to_single_file(tmp_path, tmp_path / "out" / "full.pt"), weights_only=True)
    assert single["step"] == 3 and torch.equal(single["tensors"]["train"][NAMES[1]], want["train"][NAMES[1]])
    assert torch.equal(single["state"]["optimizer"]["state"][1]["step"], torch.tensor(3.0))


@pytest.mark.parametrize("damage, reason", [
    (lambda p: (p / "dcp" / "__0_0.distcp").unlink(), r"dcp/__0_0.distcp listed in the manifest is missing"),
    (lambda p: (p / "dcp" / "__0_0.distcp").write_bytes(b"x"), r"dcp/__0_0.distcp has 1 bytes"),
    (lambda p: (p / "dcp" / ".metadata").write_bytes(bytes(reversed((p / "dcp" / ".metadata").read_bytes()))),
     r"dcp/.metadata fails its sha256 check"),
])
def test_a_damaged_shard_is_refused_naming_the_file(ckpt, damage, reason):
    damage(ckpt)
    with pytest.raises(CheckpointError, match=reason):
        load_checkpoint(ckpt)


def test_manifest_must_list_the_dcp_index(ckpt):
    manifest = json.loads((ckpt / "manifest.json").read_text())
    del manifest["files"]["dcp/.metadata"]
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"'files' does not list \['dcp/.metadata'\]"):
        load_checkpoint(ckpt)


def test_an_interrupted_save_is_never_a_checkpoint_and_is_cleaned_up(ckpt, tmp_path):
    """A save killed mid-write leaves ``.tmp-step_*-dcp`` (shards, no manifest): not listed, removed by the next
    save; a step directory that lost its manifest is incomplete."""
    partial = ckpt.parent / ".tmp-step_00000004-dcp"
    (partial / "dcp").mkdir(parents=True)
    (partial / "dcp" / "__0_0.distcp").write_bytes(b"half")
    assert list_checkpoints(tmp_path) == [(3, ckpt)]
    with pytest.warns(UserWarning):
        newer = sharded.save(tmp_path, 5, tensors(), STATE, keep_last=1)
    assert not partial.exists() and latest_checkpoint(tmp_path) == newer and list_checkpoints(tmp_path) == [(5, newer)]
    (newer / "manifest.json").unlink()
    assert incomplete_checkpoints(tmp_path) == [newer] and list_checkpoints(tmp_path) == []


def test_unsafe_state_is_refused_before_anything_is_written(tmp_path):
    import numpy as np

    with pytest.raises(CheckpointError, match=r"cannot start checkpoint .*numpy"):
        sharded.save(tmp_path, 1, tensors(), {"bad": np.zeros(2)})
    assert not (tmp_path / "checkpoints").exists()


def test_an_asynchronous_save_exists_only_once_finished_and_holds_the_state_it_was_given(tmp_path):
    """``asynchronous=True``: the tensors are copied before ``save`` returns (training may change them), the
    checkpoint appears only after ``finish`` (hashes, manifest, rename), and it reads back as given."""
    given = tensors()
    want = {n: t.clone() for n, t in given["train"].items()}
    with pytest.warns(UserWarning):
        pending = sharded.save(tmp_path, 7, given, STATE, keep_last=None, asynchronous=True)
        for t in given["train"].values():
            t.add_(1.0)                                     # training goes on
        assert list_checkpoints(tmp_path) == []
        path = pending.finish()
    assert list_checkpoints(tmp_path) == [(7, path)] and read_manifest(path)["layout"] == "dcp"
    got, _ = load_checkpoint(path)
    assert all(torch.equal(got["train"][n], want[n]) for n in NAMES)
