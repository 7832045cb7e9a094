"""The tiny video teacher: the VideoToyPolicy contract on the tiny preset, and the pretraining script (a few real
steps, a loadable fp16 checkpoint, and an exact resume)."""
import importlib.util
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flowrl.policies import POLICIES
from flowrl.policies.base import Policy
from flowrl.policies.toy_video import VideoToyPolicy

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_video_toy.py"
TINY = ["--preset", "tiny", "--batch-size", "2", "--frames", "4", "--size", "32", "--threads", "1"]


def _script():
    spec = importlib.util.spec_from_file_location("pretrain_video_toy", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def policy():
    return POLICIES.get("toy_video").tiny(seed=0)


def test_policy_contract_shapes_and_pixel_space(policy):
    assert isinstance(policy, Policy) and policy.family == "toy_video"
    cond = policy.encode(["a red circle moving right", "a blue square falls, then a green triangle appears"])
    x = policy.noise([torch.Generator().manual_seed(i) for i in range(2)], 16, 16, 4)
    assert x.shape == (2, 3, 4, 16, 16)
    v = policy.velocity(x, torch.tensor([0.3, 0.9]), cond, guidance=2.0)
    assert v.shape == x.shape and torch.isfinite(v).all()
    video = policy.decode(x.clamp(-1, 1))
    assert video.shape == (2, 4, 3, 16, 16)
    assert torch.allclose(policy.encode_pixels(video), x.clamp(-1, 1), atol=1e-6)
    with pytest.raises(ValueError, match="num_frames"):
        policy.latent_shape(16, 16)
    with pytest.raises(ValueError, match="multiple of 8"):
        VideoToyPolicy.check_resolution(20, 16, 8, tiny=True)


def test_pretraining_writes_a_loadable_fp16_checkpoint_and_resumes_exactly(tmp_path):
    mod = _script()
    straight = mod.main(TINY + ["--steps", "4", "--out", str(tmp_path / "a")])
    mod.main(TINY + ["--steps", "2", "--out", str(tmp_path / "b")])
    resumed = mod.main(TINY + ["--steps", "4", "--out", str(tmp_path / "b")])       # picks up state.pt at step 2
    assert straight["steps"] == resumed["steps"] == 4 and straight["loss_ema"] == resumed["loss_ema"]
    sa, sb = (torch.load(tmp_path / d / "state.pt", weights_only=False) for d in ("a", "b"))
    assert all(torch.equal(sa["tr"][k], sb["tr"][k]) for k in sa["tr"])
    files = sorted((tmp_path / "a" / "checkpoint").rglob("*.safetensors"))
    assert files and all(t.dtype == torch.float16 for f in files for t in load_file(f).values())
    pol = VideoToyPolicy.from_pretrained(tmp_path / "a" / "checkpoint")
    assert next(pol.transformer.parameters()).dtype == torch.float32                 # fp16 on disk, loaded as asked
    with pytest.raises(ValueError, match="state.pt was written with"):
        mod.main(TINY[:-2] + ["--threads", "1", "--lr", "1e-3", "--steps", "5", "--out", str(tmp_path / "a")])
    with pytest.raises(FileNotFoundError, match="no video toy checkpoint"):
        VideoToyPolicy.from_pretrained(tmp_path)
