"""Every benchmark figure is a valid PNG drawn by matplotlib: the learning / tree / pool / hacking-palette curves
(``plot_curves``), the balancer / hacking-front reward-space scatter (``plot_reward_space``); with matplotlib
unavailable each raises an ImportError naming the ``plots`` extra, so none is drawn another way."""
import sys

import pytest
from PIL import Image

from flowrl.bench import learning_lib


def agg(slope: float) -> dict:
    return {"curve": [{"rollout_nfe_mean": 100.0 * i, "iteration": i, "strict_mean": 0.3 + slope * i,
                       "strict_se": 0.01, "palette_mean": 0.02 + slope * i, "palette_se": 0.002} for i in range(4)]}


def reward_set() -> dict:
    gain = {"a": {"ci95": 0.02}, "b": {"ci95": 0.03}}
    return {"rewards": ["a", "b"], "base": [0.5, 0.5], "methods": {
        "ws0": {"point": [0.6, 0.55], "weights": [1, 1], "gain": gain},
        "marble": {"point": [0.62, 0.58], "gain": gain}}}


FIGURES = {
    "curves": lambda path: learning_lib.plot_curves({"grpo": agg(0.02), "nft": agg(0.03)}, path),
    "palette_curves": lambda path: learning_lib.plot_curves({"none": agg(0.01)}, path, metric="palette",
                                                            x="iteration"),
    "reward_space": lambda path: learning_lib.plot_reward_space(reward_set(), path),
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_figure_is_a_png_drawn_by_matplotlib(name, tmp_path, monkeypatch):
    path = FIGURES[name](tmp_path / "sub" / f"{name}.png")
    with Image.open(path) as img:
        assert img.format == "PNG" and img.mode == "RGB" and min(img.size) > 100
        img.verify()
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=r"flowrl\[plots\]"):
        FIGURES[name](tmp_path / f"{name}_again.png")
