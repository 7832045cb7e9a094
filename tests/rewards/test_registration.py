"""A reward registered each of the three ways (decorator, module:attr / file.py:attr, entry point) is usable
from a config mapping as the YAML loader gives it."""
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
import torch

from rewards import REWARDS, RewardError, RewardSet, make_input, register

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "reward_plugin"


def _images():
    return torch.stack([torch.full((3, 8, 8), 0.2), torch.full((3, 8, 8), 0.9)])


@pytest.fixture
def registered():
    @register("test_darkness")
    def darkness(batch, power: float = 1.0):
        return (1 - batch.pixels.flatten(1).mean(1)) ** power

    yield darkness
    REWARDS._objects.pop("test_darkness", None)


def test_decorator_registration(registered):
    rs = RewardSet.from_config({"test_darkness": {"weight": 2.0, "kwargs": {"power": 2.0}}})
    out = rs(make_input(_images()))
    torch.testing.assert_close(out.scores[:, 0], torch.tensor([0.8**2, 0.1**2]))
    torch.testing.assert_close(out.total, 2 * out.scores[:, 0])


def test_module_attr_and_file_path(tmp_path, monkeypatch):
    src = textwrap.dedent('''
        from dataclasses import dataclass
        @dataclass
        class Config:
            offset: float = 0.0
        class Red:
            Config = Config
            def __init__(self, cfg): self.cfg = cfg
            def __call__(self, batch):
                return {"score": batch.pixels[:, 0].mean((1, 2)) + self.cfg.offset,
                        "green": batch.pixels[:, 1].mean((1, 2))}
    ''')
    (tmp_path / "my_red_reward.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = {"red_mod": {"reward": "my_red_reward:Red", "kwargs": {"offset": 1.0}},
           "red_file": {"reward": f"{tmp_path}/my_red_reward.py:Red", "weight": 0.5}}
    out = RewardSet.from_config(cfg)(make_input(_images()))
    torch.testing.assert_close(out.scores[:, 0], torch.tensor([1.2, 1.9]))
    torch.testing.assert_close(out.scores[:, 1], torch.tensor([0.2, 0.9]))
    assert set(out.sub_scores) == {"red_mod/green", "red_file/green"}


def _fake_install(site: Path) -> None:
    """A .dist-info built from the example's own pyproject: what pip would write, without touching the venv."""
    meta = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    shutil.copytree(PLUGIN / "flowrl_reward_example", site / "flowrl_reward_example")
    info = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    eps = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
                  for group, entries in meta["entry-points"].items())
    (info / "entry_points.txt").write_text(eps)


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch, request):
    site = tmp_path / "site"
    site.mkdir()
    if request.param == "pip":
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
               "--quiet", "--target", str(site), str(tmp_path / "src")]
        shutil.copytree(PLUGIN, tmp_path / "src")  # pip builds in-tree: keep artefacts out of the repo
        subprocess.run(cmd, check=True, capture_output=True, timeout=300, cwd=tmp_path)
    else:
        _fake_install(site)
    monkeypatch.syspath_prepend(str(site))
    yield
    REWARDS._objects.pop("brightness", None)
    sys.modules.pop("flowrl_reward_example", None)


@pytest.mark.parametrize("installed_plugin", ["dist-info", pytest.param("pip", marks=pytest.mark.slow)],
                         indirect=True)
def test_entry_point_plugin(installed_plugin):
    assert "brightness" in REWARDS.names()
    out = RewardSet.from_config({"brightness": {"kwargs": {"target": 0.5}}})(make_input(_images()))
    torch.testing.assert_close(out.scores[:, 0], torch.tensor([-0.3, -0.4]))
    torch.testing.assert_close(out.sub_scores["brightness/mean"], torch.tensor([0.2, 0.9]))


def test_entry_point_absent_without_install():
    assert "brightness" not in REWARDS.names()
    with pytest.raises(RewardError, match="unknown reward 'brightness'"):
        RewardSet.from_config({"brightness": 1.0})


def test_import_is_cheap(import_probe):
    """A fresh interpreter that imported rewards and resolved every reward but the shapes ones
    (conftest.import_probe) holds no model or OCR library, nor PIL."""
    bad = [m for m in ('open_clip', 'transformers', 'PIL', 'paddleocr', 'rapidocr') if m in import_probe["rewards"]]
    assert not bad, bad
