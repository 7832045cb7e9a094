"""The hacking benchmark's runs are valid configs: every method of every base (unguarded, KL, each guard, the
KL-β sweep) and the Flow-DPPO block's guard load on their base recipe, and each guard changes the objective."""
from argparse import Namespace
from pathlib import Path

import pytest

from flowrl.bench.benchmarks import hacking
from flowrl.config import load_config

REPO = Path(__file__).resolve().parents[2]



@pytest.mark.parametrize("base", hacking.BASES)
def test_every_method_loads_on_its_base_recipe(base):
    recipe = REPO / "configs" / "toy" / f"{base}.yaml"
    plain = load_config(recipe)
    methods = hacking.methods(base, Namespace(sweep_size=dict.fromkeys(hacking.BASES, 4)))
    assert {"none", "kl"} <= set(methods) and len(methods) >= 2 + len(hacking.guard_objectives(base))
    for name, overrides in methods.items():
        cfg = load_config(recipe, overrides)
        if name == "none":
            assert cfg.objective.beta_kl == 0.0
        elif name in hacking.guard_objectives(base):
            assert cfg.objective != plain.objective, name


def test_the_dppo_block_overrides_load():
    dppo = hacking.guard_objectives("grpo")["dppo"]
    cfg = load_config(REPO / "configs/toy/grpo.yaml", [*hacking.guard_overrides(dppo), "train.updates_per_epoch=4",
                                                      "train.micro_batch=8"])
    assert cfg.objective.kind == "dppo"


def test_the_sweep_size_is_read_per_base():
    args = hacking.parse(["--sweep-size", "grpo=3,nft=4"])
    assert args.sweep_size == {"grpo": 3, "nft": 4}
    assert set(hacking.kl_front("grpo", args)) == {"none", "kl", "kl=0.004", "kl=0.01"}          # 0.04 is the recipe's
    assert set(hacking.kl_front("nft", args)) == {"none", "kl", "kl=0.001", "kl=0.01", "kl=0.1"}  # 1e-4 is the recipe's
