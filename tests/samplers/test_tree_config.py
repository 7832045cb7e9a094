"""``sampler.tree``: a preset and/or the five choices → the TreeSpec the engine and credit read, strictly, and
the resolved config round-trips through YAML (what resume reads)."""
import pytest

from flowrl.config import ConfigError, dump_yaml, load_config
from flowrl.config.loader import from_dict, parse_yaml
from flowrl.config.schema import RunConfig
from samplers import tree_spec as ts
from samplers.tree_config import TreeConfig
from samplers.windows import FixedSteps


def test_a_preset_alone_is_the_preset_with_the_given_window():
    window = FixedSteps(())
    spec = TreeConfig(preset="branchgrpo_depth_pruned").spec(window)
    ref = ts.branchgrpo_depth_pruned()
    assert spec.window is window
    assert (spec.branching, spec.noise, spec.backup, spec.advantage, spec.train) == \
        (ref.branching, ref.noise, ref.backup, ref.advantage, ref.train)


def test_a_given_component_replaces_the_presets_whole_component():
    cfg = TreeConfig(preset="branchgrpo", branching=ts.FixedSplits((0, 2, 4)),
                     train=ts.TrainEdges(width="best_worst"))
    spec = cfg.spec(None)
    assert spec.branching == ts.FixedSplits((0, 2, 4), 2) and spec.noise == ts.SplitNoise(4.0)
    assert spec.train == ts.TrainEdges(width="best_worst")          # depth_prune etc. back to the defaults


def test_no_preset_starts_from_the_spec_defaults():
    spec = TreeConfig(preset=None, noise=ts.SplitNoise(2.0)).spec(None)
    ref = ts.TreeSpec()
    assert spec.branching == ref.branching and spec.advantage == ref.advantage
    assert spec.noise == ts.SplitNoise(2.0)


def test_yaml_section_builds_the_branching_through_its_registry_and_round_trips():
    ov = ["sampler.tree={preset: treegrpo, branching: {kind: window, size: 2, every: 5}, "
          "advantage: {kind: parent, std: group}}"]
    cfg = load_config(None, ov)
    spec = cfg.sampler.tree.spec(None)
    assert spec.branching == ts.SplitWindow(size=2, every=5) and spec.advantage.kind == "parent"
    assert spec.train.window_only                                      # the preset's
    again = from_dict(RunConfig, parse_yaml(dump_yaml(cfg)))
    assert again.sampler.tree.spec(None) == spec and load_config(None).sampler.tree is None


@pytest.mark.parametrize("bad, message", [
    ("sampler.tree={preset: brnachgrpo}", "preset must be one of"),
    ("sampler.tree={branching: {kind: fixd}}", "did you mean 'fixed'"),
    ("sampler.tree={backup: {kind: max}}", "Backup.kind must be one of"),
    ("sampler.tree={noise: {scale: 0.0}}", "scale must be > 0"),
    ("sampler.tree={branching: {kind: fixed, factor: 1}}", None),
])
def test_bad_values_name_the_key(bad, message):
    if message is None:                     # checked when the plan is made (FixedSplits validates lazily)
        cfg = load_config(None, [bad])
        with pytest.raises(ValueError, match="factor must be >= 2"):
            cfg.sampler.tree.spec(None).branching.plan(0, 10)
        return
    with pytest.raises(ConfigError, match=message):
        load_config(None, [bad])
