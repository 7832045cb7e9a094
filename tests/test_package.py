"""Packaging: the top-level packages are ours, and importing them is cheap."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_top_level_packages_resolve_inside_repo():
    import flowrl
    import rewards
    import samplers

    for mod in (flowrl, rewards, samplers):
        assert Path(mod.__file__).resolve().is_relative_to(REPO), mod.__file__


def test_import_is_cheap(import_probe):
    """Importing the three packages must not import model libraries or load weights (conftest.import_probe: one
    interpreter that resolved the rewards first, so it holds at least what these imports load)."""
    heavy = ['diffusers', 'transformers', 'open_clip', 'peft', 'accelerate']
    assert [m for m in heavy if m in import_probe["packages"]] == []
