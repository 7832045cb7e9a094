"""The plugin example in docs/rewards.md runs as written."""
import re
from pathlib import Path

from rewards import REWARDS

DOC = Path(__file__).resolve().parents[2] / "docs" / "rewards.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_plugin_example_runs():
    section = DOC.read_text().split("## Writing a reward plugin", 1)[1]
    code = _python_blocks(section)[0]
    assert 10 <= len(code.strip().splitlines()) <= 30
    try:
        exec(compile(code, str(DOC), "exec"), {"__name__": "docs_example"})  # noqa: S102 - our own docs
    finally:
        REWARDS._objects.pop("saturation", None)
