"""``scripts/bench.py redraw`` rebuilds the learning, balancer and hacking figures from the committed results alone."""
import json
from pathlib import Path

from PIL import Image

from flowrl.bench.benchmarks import redraw

REPO = Path(__file__).resolve().parents[2]


def test_redraw_writes_every_figure_its_results_hold(tmp_path):
    out = redraw.main(["--out", str(tmp_path)])
    sets = json.loads((REPO / "docs/benchmarks/balancers.json").read_text())["sets"]
    names = {Path(p).name for p in out["plots"]}
    hacking = {"hacking_grpo_front.png", "hacking_grpo_palette.png", "hacking_nft_front.png"}  # nft/none: no curve
    assert names == {"learning_strict.png", "learning_partial.png"} | {f"balancers_{s}.png" for s in sets} | hacking
    for p in out["plots"]:
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size[0] > 300


def test_learning_curves_are_rebuilt_point_for_point():
    methods = {"grpo": {"curve": [[0, 0.3, 0.0], [10, 0.4, 0.01]], "curve_partial": [[0, 0.7, 0.0]]}}
    agg = redraw.learning_aggregates(methods, "strict")["grpo"]["curve"]
    assert agg[1] == {"rollout_nfe_mean": 10, "strict_mean": 0.4, "strict_se": 0.01}
    assert redraw.learning_aggregates(methods, "partial")["grpo"]["curve"][0]["partial_mean"] == 0.7


def test_hacking_sweep_betas_read_the_methods_names():
    methods = {"grpo/none": {}, "grpo/kl": {}, "grpo/kl=0.01": {}, "grpo/dppo": {}, "nft/none": {}}
    betas = redraw.sweep_betas("grpo", methods)
    assert betas["none"] == 0.0 and betas["kl=0.01"] == 0.01 and set(betas) == {"none", "kl", "kl=0.01"}
    assert betas["kl"] > 0                                   # the recipe's β_KL, read from configs/toy/grpo.yaml
