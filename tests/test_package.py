"""Packaging: the top-level packages are ours, and importing them is cheap."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_top_level_packages_resolve_inside_repo():
    import flowrl
    import rewards
    import samplers

    for mod in (flowrl, rewards, samplers):
        assert Path(mod.__file__).resolve().is_relative_to(REPO), mod.__file__


def test_import_is_cheap():
    """Importing the three packages must not import model libraries or load weights."""
    code = (
        "import sys, json; import flowrl, samplers, rewards, flowrl.policies; "
        "heavy = ['diffusers', 'transformers', 'open_clip', 'peft', 'accelerate']; "
        "print(json.dumps([m for m in heavy if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
