"""flowrl.checkpoint: bitwise round trip, exact RNG resume, atomicity under a crash, clear errors."""
from __future__ import annotations

import json
import multiprocessing
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import flowrl.checkpoint.store as ck
from flowrl.checkpoint import (
    CheckpointError,
    capture_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    restore_rng_state,
    save_checkpoint,
)


def _model_and_opt(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, opt


def _train_steps(model, opt, n):
    losses = []
    for _ in range(n):
        x = torch.randn(16, 4)  # draws from the global RNG: resume must restore it
        loss = (model(x) ** 2).mean() + 0.01 * float(np.random.rand()) + 0.01 * random.random()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def _assert_bitwise(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a, b.view(torch.uint8)
                       if b.dtype == torch.bfloat16 else b)


def test_round_trip_is_bitwise_and_resume_continues_exactly(tmp_path):
    model, opt = _model_and_opt()
    _train_steps(model, opt, 3)
    extra = {"bf16": torch.randn(5, 3).to(torch.bfloat16), "int": torch.arange(6)}
    state = {"optimizer": opt.state_dict(), "step": 3, "data": {"epoch": 1, "position": 17},
             "window": {"start": 2}, "rng": capture_rng_state()}  # captured last: nothing draws after it
    path = save_checkpoint(tmp_path, 3, {"model": model.state_dict(), "misc": extra}, state)
    expected = _train_steps(model, opt, 4)  # the uninterrupted continuation

    tensors, loaded = load_checkpoint(tmp_path)  # run dir → its latest checkpoint
    assert resolve_checkpoint(tmp_path) == path
    for k, v in extra.items():
        _assert_bitwise(v, tensors["misc"][k])
    model2, opt2 = _model_and_opt(seed=123)  # different init: everything must come from the checkpoint
    model2.load_state_dict(tensors["model"])
    opt2.load_state_dict(loaded["optimizer"])
    assert loaded["step"] == 3 and loaded["data"] == {"epoch": 1, "position": 17}
    restore_rng_state(loaded["rng"])
    resumed = _train_steps(model2, opt2, 4)
    assert torch.equal(resumed, expected)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)


def test_rng_state_restores_every_generator():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # leaves numpy with a cached gaussian
    state = capture_rng_state()
    ck._check_weights_only_safe(state)
    first = (random.random(), random.gauss(0, 1), np.random.randn(3).tolist(), torch.randn(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng_state(state)
    again = (random.random(), random.gauss(0, 1), np.random.randn(3).tolist(), torch.randn(3))
    assert first[:3] == again[:3] and torch.equal(first[3], again[3])


def test_state_file_loads_with_weights_only(tmp_path):
    _, opt = _model_and_opt()
    path = save_checkpoint(tmp_path, 0, {}, {"opt": opt.state_dict(), "rng": capture_rng_state(),
                                             "dtype": torch.bfloat16, "none": None, "t": (1, 2.5, "x")})
    state = torch.load(path / "state.pt", weights_only=True)
    assert state["dtype"] is torch.bfloat16 and state["t"] == (1, 2.5, "x")


def test_unsafe_state_is_refused_before_writing(tmp_path):
    with pytest.raises(CheckpointError, match=r"state\['balancer'\]\['alpha'\].*numpy"):
        save_checkpoint(tmp_path, 1, {}, {"balancer": {"alpha": np.zeros(3)}})
    with pytest.raises(CheckpointError, match="not a Tensor"):
        save_checkpoint(tmp_path, 1, {"w": {"a": [1.0]}}, {})
    assert latest_checkpoint(tmp_path) is None


def test_keep_last_and_resave_same_step(tmp_path):
    for step in range(5):
        save_checkpoint(tmp_path, step, {"w": {"x": torch.full((2,), float(step))}}, {"step": step}, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    save_checkpoint(tmp_path, 4, {"w": {"x": torch.full((2,), 40.0)}}, {"step": 4}, keep_last=2)
    tensors, _ = load_checkpoint(tmp_path)
    assert tensors["w"]["x"].tolist() == [40.0, 40.0]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000003", "step_00000004"]


def test_shared_storage_tensors_are_saved(tmp_path):
    base = torch.randn(4, 4)
    save_checkpoint(tmp_path, 0, {"w": {"a": base, "tied": base, "view": base[1]}}, {})
    tensors, _ = load_checkpoint(tmp_path)
    assert torch.equal(tensors["w"]["tied"], base) and torch.equal(tensors["w"]["view"], base[1])


def test_failure_mid_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 1, {"w": {"x": torch.ones(3)}}, {"step": 1})

    def crash(*args, **kwargs):
        Path(args[1]).write_bytes(b"half a pickle")  # a partial state file, then the failure
        raise OSError("disk full")

    monkeypatch.setattr(ck.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, {"w": {"x": torch.zeros(3)}}, {"step": 2})
    assert latest_checkpoint(tmp_path).name == "step_00000001"
    tensors, state = load_checkpoint(tmp_path)
    assert state["step"] == 1 and tensors["w"]["x"].tolist() == [1.0, 1.0, 1.0]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000001"]


def _die_mid_save(directory):
    """The forked writer: its torch.save exits the process (no cleanup, no atexit) right after the weights file."""
    def die(*a, **k):
        os._exit(9)
    ck.torch.save = die
    ck.save_checkpoint(directory, 2, {"w": {"x": torch.zeros(3)}}, {"step": 2})


def test_process_killed_mid_write_leaves_a_loadable_latest(tmp_path):
    """A real crash: the writer process dies (os._exit) after the weights file, before state/manifest. The writer
    is forked, so it needs no fresh interpreter (a torch import costs seconds)."""
    save_checkpoint(tmp_path, 1, {"w": {"x": torch.ones(3)}}, {"step": 1})
    proc = multiprocessing.get_context("fork").Process(target=_die_mid_save, args=(str(tmp_path),))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 9, proc.exitcode
    leftovers = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert any(n.startswith(".tmp-step_00000002") for n in leftovers)  # the half write is there...
    assert latest_checkpoint(tmp_path).name == "step_00000001"  # ...and ignored
    assert load_checkpoint(tmp_path)[1]["step"] == 1
    save_checkpoint(tmp_path, 2, {"w": {"x": torch.zeros(3)}}, {"step": 2})  # the next save cleans it up
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000001", "step_00000002"]


def test_missing_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="neither a checkpoint"):
        load_checkpoint(tmp_path / "empty")


def test_corrupt_checkpoint_errors(tmp_path):
    path = save_checkpoint(tmp_path, 7, {"w": {"x": torch.randn(64)}}, {"step": 7})
    data = bytearray((path / "w.safetensors").read_bytes())
    data[-5] ^= 0xFF
    (path / "w.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(path)
    (path / "state.pt").write_bytes(b"trunc")
    with pytest.raises(CheckpointError, match="state.pt has 5 bytes"):
        load_checkpoint(path, verify=False)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="manifest.json is corrupt"):
        load_checkpoint(path)
    os.remove(path / "manifest.json")
    assert latest_checkpoint(tmp_path) is None
    with pytest.raises(CheckpointError, match="no manifest.json"):
        ck.read_manifest(path)


def test_manifest_lists_files(tmp_path):
    path = save_checkpoint(tmp_path, 12, {"train": {"a": torch.zeros(2)}}, {})
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 12 and manifest["groups"] == ["train"]
    assert set(manifest["files"]) == {"train.safetensors", "state.pt"}
