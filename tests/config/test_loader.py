"""The strict loader: unknown keys, wrong types and missing files fail with messages that name the key, the
file and the fix; overrides parse as YAML scalars; tagged plugin sections build the plugin's own Config."""
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from flowrl.config.loader import ConfigError, Plugin, dump_yaml, from_dict, load_yaml, parse_yaml, plugin_field
from flowrl.registry import Registry


@dataclass
class _GrpoConfig:
    clip_range: float = 1e-4
    kl_beta: float = 0.0


class _NoSettings:
    pass


@pytest.fixture(autouse=True)
def fake_registry():
    mod = types.ModuleType("fake_plugins_for_config_tests")
    mod.REG = Registry("objective")
    mod.REG.register("grpo", _GrpoConfig)          # a registry entry that *is* the Config dataclass
    mod.REG.register("plain", _NoSettings)         # a plugin without settings
    sys.modules[mod.__name__] = mod
    yield mod
    del sys.modules[mod.__name__]


@dataclass
class Train:
    lr: float = 3e-4
    steps: int = 10
    mode: Literal["lora", "full"] = "lora"
    betas: tuple[float, float] = (0.9, 0.999)
    seeds: list[int] = field(default_factory=lambda: [0])
    note: str | None = None


@dataclass
class Root:
    train: Train = field(default_factory=Train)
    objective: Any = plugin_field("fake_plugins_for_config_tests:REG", "grpo")


def write(tmp_path, text, name="recipe.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_unknown_key_names_key_file_and_nearest(tmp_path):
    p = write(tmp_path, "train:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as e:
        load_yaml(Root, p)
    msg = str(e.value)
    assert "train.lrr" in msg and str(p) in msg and "did you mean 'lr'" in msg


def test_unknown_plugin_key_uses_the_plugins_config(tmp_path):
    p = write(tmp_path, "objective: {kind: grpo, clip_rang: 0.2}\n")
    with pytest.raises(ConfigError, match=r"objective\.clip_rang.*did you mean 'clip_range'"):
        load_yaml(Root, p)


def test_unknown_plugin_kind_suggests(tmp_path):
    p = write(tmp_path, "objective: {kind: grop}\n")
    with pytest.raises(ConfigError, match=r"objective\.kind.*did you mean 'grpo'"):
        load_yaml(Root, p)


def test_wrong_type_names_key_and_file(tmp_path):
    p = write(tmp_path, "train:\n  steps: ten\n")
    with pytest.raises(ConfigError) as e:
        load_yaml(Root, p)
    assert "train.steps" in str(e.value) and "expected an int" in str(e.value) and str(p) in str(e.value)


def test_bool_is_not_an_int_and_literal_is_checked():
    with pytest.raises(ConfigError, match="train.steps"):
        from_dict(Root, {"train": {"steps": True}})
    with pytest.raises(ConfigError, match=r"train\.mode.*one of \['lora', 'full'\]"):
        from_dict(Root, {"train": {"mode": "fulll"}})


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        load_yaml(Root, tmp_path / "nope.yaml")


def test_overrides_are_yaml_scalars_and_override_errors_name_the_command_line(tmp_path):
    p = write(tmp_path, "train: {lr: 0.1}\n")
    cfg = load_yaml(Root, p, ["train.lr=1e-4", "train.steps=7", "train.seeds=[1, 2]", "train.note=null",
                              "objective.kl_beta=0.04"])
    assert cfg.train.lr == 1e-4 and isinstance(cfg.train.lr, float)
    assert cfg.train.steps == 7 and cfg.train.seeds == [1, 2] and cfg.train.note is None
    assert cfg.objective.kind == "grpo" and cfg.objective.kl_beta == 0.04 and cfg.objective.clip_range == 1e-4
    with pytest.raises(ConfigError, match=r"train\.step: unknown key; did you mean 'steps'.*'train.step=3'"):
        load_yaml(Root, p, ["train.step=3"])
    assert load_yaml(Root, p, ["~train.lr"]).train.lr == 3e-4   # ~key resets to the default


def test_plugin_kind_switch_and_no_settings_plugin():
    cfg = from_dict(Root, {"objective": "plain"})
    assert cfg.objective == Plugin("plain", None)
    with pytest.raises(ConfigError, match="takes no settings"):
        from_dict(Root, {"objective": {"kind": "plain", "x": 1}})


def test_int_to_float_list_to_tuple_and_dump_roundtrip(tmp_path):
    cfg = from_dict(Root, {"train": {"lr": 1, "betas": [0.8, 0.9]}})
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float) and cfg.train.betas == (0.8, 0.9)
    p = write(tmp_path, dump_yaml(cfg), "resolved.yaml")
    assert load_yaml(Root, p) == cfg


def test_yaml_reads_exponent_without_dot_as_float():
    assert parse_yaml("a: 1e-4\nb: 3\nc: '1e-4'") == {"a": 1e-4, "b": 3, "c": "1e-4"}
