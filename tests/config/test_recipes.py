"""Every YAML recipe under configs/ (recursively) loads strictly with its schema: RL recipes as ``RunConfig``,
``configs/distill/`` as the distillation config; ``configs/accelerate/`` are accelerate's own files."""
from pathlib import Path

import pytest

from flowrl.config import RunConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = sorted(p for p in CONFIGS.rglob("*.yaml") if "accelerate" not in p.relative_to(CONFIGS).parts)


def test_there_are_recipes():
    names = {str(p.relative_to(CONFIGS)) for p in RECIPES}
    assert {"default.yaml", "toy/grpo.yaml", "toy/nft.yaml", "toy/awr.yaml", "sd35/grpo_pickscore.yaml",
            "sd35/nft_multireward.yaml", "flux/grpo_pickscore.yaml", "wan21/awr_video.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_recipe_loads(path):
    if path.relative_to(CONFIGS).parts[0] == "distill":
        from flowrl.distill.config import load_config as load_distill_config

        assert load_distill_config(str(path)) is not None
        return
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig) and cfg.rewards
    first_comment = path.read_text().splitlines()[0]
    assert first_comment.startswith("#"), f"{path}: start with a header comment naming the anchor"
    assert "scripts/train.py" in path.read_text(), f"{path}: the header must give the launch command"
