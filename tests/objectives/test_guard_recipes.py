"""The guard recipes (configs/toy/guards/<base>_<guard>.yaml, base = the first word) are their base recipe
(configs/toy/<base>.yaml) with only the objective and the run name changed (GARDO also adds its "ref" adapter and
an auxiliary weight-0 reward), so a retuned base is noticed here; a wrapped objective is the base's own with its
KL to the base removed (the guard replaces it), or kept at a swept value where the recipe composes the two
(``<base>_<guard>_kl.yaml``)."""
from pathlib import Path

import pytest

from flowrl.config import load_config
from flowrl.config.loader import read_yaml_file

REPO = Path(__file__).resolve().parents[2]
GUARDS = sorted((REPO / "configs" / "toy" / "guards").glob("*.yaml"))


def base_of(guard: Path) -> Path:
    return REPO / "configs" / "toy" / f"{guard.stem.split('_')[0]}.yaml"


def test_there_are_guard_recipes_for_grpo_and_nft():
    bases = {base_of(g).stem for g in GUARDS}
    assert {"grpo", "nft"} <= bases and all(base_of(g).is_file() for g in GUARDS)


@pytest.mark.parametrize("guard", GUARDS, ids=lambda p: p.stem)
def test_guard_recipe_is_its_base_with_another_objective(guard):
    g, b = read_yaml_file(guard), read_yaml_file(base_of(guard))
    assert set(g) == set(b)
    own = {"objective", "run"} | ({"policy", "rewards"} if g["objective"]["kind"] == "gardo" else set())
    for section in set(g) - own:
        assert g[section] == b[section], f"{guard.name}: section {section!r} differs from {base_of(guard).name}"
    assert {k: v for k, v in g["run"].items() if k != "name"} == {k: v for k, v in b["run"].items() if k != "name"}
    assert g["run"]["name"] != b["run"]["name"]
    if g["objective"]["kind"] == "normguard":
        inner = g["objective"]["inner"]
        composed = guard.stem.endswith("_kl")
        assert inner == {**b["objective"], "beta_kl": inner["beta_kl"]}
        assert (inner["beta_kl"] > 0) == composed, f"{guard.name}: a KL only in a *_kl composition"
    elif g["objective"]["kind"] == "gardo":        # its KL (gated, to a refreshable "ref") is the guard
        assert "ref" in g["policy"]["lora"]["names"] and any(r["weight"] == 0 for r in g["rewards"].values())
    else:
        assert b["objective"]["kind"] == "grpo" and g["objective"].get("beta_kl", 0.0) == 0.0
    cfg = load_config(guard)
    assert cfg.objective.kind == g["objective"]["kind"]
