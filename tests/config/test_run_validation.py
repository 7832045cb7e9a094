"""Config validation (issue #16 item 3): every mistake in ``flowrl/bench/faults.py``'s BAD_CONFIGS (the
list ``bench.py reliability`` tallies) is refused by scripts/train.py before any model loads, with exit 1 and
one line naming the key; the loader blames the override that set the bad key; the ranges are in the message."""
import pytest

from flowrl.bench import faults
from flowrl.config import ConfigError, load_config

F = faults


@pytest.mark.parametrize("overrides,key", F.BAD_CONFIGS, ids=[" ".join(ov) for ov, _ in F.BAD_CONFIGS])
def test_bad_config_is_one_line_naming_the_key_before_the_model_loads(tmp_path, overrides, key):
    result = F.check_bad_config(overrides, key, tmp_path)
    assert result["clear"], result


def test_the_override_that_set_the_key_is_blamed():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.iterations=5", "train.group_size=0"])
    assert str(e.value).startswith("train.group_size: must be ≥ 2, got 0") and "'train.group_size=0'" in str(e.value)
    assert "train.iterations=5" not in str(e.value)


@pytest.mark.parametrize("override,expected", [
    ("train.lr=-1", "train.lr: must be > 0, got -1.0"),
    ("train.ema_decay=1.5", "train.ema_decay: must be in [0, 1) or null (no eval EMA), got 1.5"),
    ("run.seed=-1", "run.seed: must be in [0, 4294967295], got -1"),
    ("checkpoint.keep=0", "checkpoint.keep: must be ≥ 1, got 0"),
    ("advantage.balancer.eps=-1", "advantage.balancer.eps: weighted_sum eps must be > 0, got -1.0"),
])
def test_messages_give_the_allowed_range(override, expected):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value).startswith(expected)


def test_the_bare_defaults_still_load():
    """Startability (rewards, resolution, files) is the trainer's check, so ``load_config(None)`` — a toy policy
    at 512² without rewards — still loads for inspection and tests."""
    cfg = load_config(None)
    assert cfg.rewards == {} and cfg.sampler.height == 512


def test_resolution_is_the_policy_familys():
    from flowrl.policies import POLICIES

    POLICIES.get("sd3").check_resolution(512, 768)
    with pytest.raises(ValueError, match="height must be a positive multiple of 16 for sd3"):
        POLICIES.get("sd3").check_resolution(33, 512)
    POLICIES.get("sd3").check_resolution(33, 7, tiny=True)            # the tiny preset: VAE factor 1, patch 1
    with pytest.raises(ValueError, match="width must be a positive multiple of 2 for flux"):
        POLICIES.get("flux").check_resolution(32, 33, tiny=True)
    with pytest.raises(ValueError, match="num_frames: Wan makes videos"):
        POLICIES.get("wan").check_resolution(480, 832, 80)
    POLICIES.get("wan").check_resolution(480, 832, 81)


def test_a_local_checkpoints_own_factors_are_read(tmp_path):
    import json

    from flowrl.policies import POLICIES

    for sub, cfg in (("vae", {"block_out_channels": [4, 8]}), ("transformer", {"patch_size": 2})):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "config.json").write_text(json.dumps(cfg))
    POLICIES.get("sd3").check_resolution(36, 36, path=str(tmp_path))    # 2 × 2 = 4
    with pytest.raises(ValueError, match="multiple of 4"):
        POLICIES.get("sd3").check_resolution(34, 36, path=str(tmp_path))
