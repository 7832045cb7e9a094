"""The RunConfig schema on the real registries: rewards keyed by name, reward kwargs checked against the reward's
Config, policy load settings beside the family Config, resolved config round trip, batch geometry errors."""
import pytest

from flowrl.config import ConfigError, check_geometry, load_config, load_resolved, save_resolved

TOY = "configs/toy/nft.yaml"


def test_rewards_are_keyed_by_name_and_overridable():
    cfg = load_config(TOY, ["rewards.shapes.weight=0.5", "rewards.shapes.kwargs.mode=strict",
                            "rewards.shapes_clean=0.25"])
    assert cfg.rewards["shapes"].weight == 0.5 and cfg.rewards["shapes"].kwargs == {"mode": "strict"}
    assert cfg.rewards["shapes_clean"].weight == 0.25


def test_a_list_of_rewards_is_refused():
    with pytest.raises(ConfigError, match="keyed by name, not a list"):
        load_config(TOY, ["rewards=[shapes]"])


def test_reward_kwargs_are_checked_against_the_rewards_config():
    with pytest.raises(ConfigError, match=r"rewards\.shapes\.kwargs\.mod: unknown key; did you mean 'mode'"):
        load_config(TOY, ["rewards.shapes.kwargs.mod=strict"])


def test_unknown_reward_name_suggests():
    with pytest.raises(ConfigError, match=r"rewards\.shapez.*did you mean 'shapes'"):
        load_config(TOY, ["rewards={shapez: 1.0}"])


def test_policy_load_settings_and_family_config_share_the_section():
    cfg = load_config(TOY, ["policy.path=/some/dir", "policy.lora=null", "policy.shift=3.0"])
    assert cfg.policy.kind == "toy" and cfg.policy.common.path == "/some/dir" and cfg.policy.config.lora is None
    assert cfg.policy.shift == 3.0 and cfg.policy.path == "/some/dir"
    with pytest.raises(ConfigError, match=r"policy\.shfit: unknown key; did you mean 'shift'"):
        load_config(TOY, ["policy.shfit=3.0"])


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config("configs/sd35/grpo_pickscore.yaml", [f"run.output_dir={tmp_path}"])
    save_resolved(cfg)
    again = load_resolved(tmp_path / cfg.run.name)
    assert again == cfg
    with pytest.raises(ConfigError, match="cannot resume"):
        load_resolved(tmp_path / "nothing-here")


def test_batch_geometry_that_does_not_split_is_refused_with_valid_values():
    cfg = load_config(TOY, ["train.prompts_per_iter=3", "train.group_size=4", "train.micro_batch=5"])
    with pytest.raises(ConfigError, match=r"valid micro_batch values: \[1, 2, 3, 6\]"):
        check_geometry(cfg, 1)
    with pytest.raises(ConfigError, match="do not split over 5 processes"):
        check_geometry(cfg, 5)
