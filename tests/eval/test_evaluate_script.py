"""scripts/evaluate.py in process, with trainer-format checkpoints (flowrl.checkpoint groups "train" / "old" /
"ema", as flowrl.checkpoint.resume.save_run writes them).

Fast tests use the analytic policy (closed-form images, a one-parameter "train" weight set), so the scores
prove which weights each column sampled; the slow test runs the real tiny toy policy."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flowrl.checkpoint import save_checkpoint

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("flowrl_evaluate_script", REPO / "scripts" / "evaluate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def brightness_reward():
    from rewards import REWARDS

    REWARDS.register("eval_test_brightness", lambda batch: batch.pixels.flatten(1).mean(1))
    return "eval_test_brightness"


def _analytic_checkpoint(run_dir: Path, step: int, shift: float, ema_shift: float) -> None:
    save_checkpoint(run_dir, step, {"train": {"shift": torch.tensor([shift])}, "old": {"shift": torch.tensor([0.0])},
                                    "ema": {"00000": torch.tensor([ema_shift])}}, {"loop": {"iteration": step}})


@pytest.mark.parametrize("weights,moved", [("train", 0.3), ("ema", 0.1)])
def test_checkpoint_columns_sample_the_checkpoint_weights(tmp_path, brightness_reward, weights, moved):
    from eval_analytic_policy import AnalyticPolicy

    ev = _script()
    policy = AnalyticPolicy(shift=0.05)
    ev.build_policy = lambda st, cfg, device: policy
    run = tmp_path / "run"
    _analytic_checkpoint(run, 3, 0.0, 0.0)
    _analytic_checkpoint(run, 9, 0.3, 0.1)
    prompts = ["a red circle", "two blue squares", "a star"]
    (tmp_path / "p.txt").write_text("# eval prompts\n" + "\n".join(prompts) + "\n")
    out = tmp_path / "out"
    summary = ev.main(["--policy", "toy", "--checkpoint", str(run / "checkpoints" / "step_00000003"), str(run),
                       "--weights", weights, "--prompts", str(tmp_path / "p.txt"), "--seeds", "0,1",
                       "--rewards", brightness_reward, "--steps", "3", "--height", "8", "--width", "8",
                       "--out", str(out)])
    base = np.mean([policy.level(p) for p in prompts])
    name = brightness_reward
    assert summary[f"eval/base/{name}/mean"] == pytest.approx(base, abs=1e-5)
    assert summary[f"eval/step_3/{name}/mean"] == pytest.approx(base, abs=1e-5)
    assert summary[f"eval/step_9/{name}/mean"] == pytest.approx(base + moved, abs=1e-5)
    assert policy.shift.item() == pytest.approx(0.05)  # the policy's own weights are back
    assert {p.name for p in out.iterdir()} == {"grid_000.png", "index.html", "metrics.jsonl", "command.json"}
    cmd = json.loads((out / "command.json").read_text())
    assert cmd["weights"] == weights and cmd["seeds"] == [0, 1] and cmd["rewards"] == [name]


@pytest.mark.parametrize("fmt", ["mp4", "gif"])
def test_video_policy_gives_video_grid(tmp_path, brightness_reward, fmt):
    from eval_analytic_policy import AnalyticPolicy

    ev = _script()
    ev.build_policy = lambda st, cfg, device: AnalyticPolicy(video_frames=3)
    out = tmp_path / "out"
    ev.main(["--policy", "wan", "--tiny", "--prompts", "heldout", "--num-prompts", "2", "--seeds", "0",
             "--rewards", brightness_reward, "--steps", "2", "--height", "8", "--width", "8", "--num-frames", "3",
             "--video-format", fmt, "--out", str(out)])
    assert {p.name for p in out.iterdir()} == {f"grid_000.{fmt}", "index.html", "metrics.jsonl", "command.json"}


@pytest.fixture(scope="module")
def toy():
    from flowrl.policies.toy import ToyPolicy

    return ToyPolicy.tiny(seed=0)


def _trainer_checkpoint(run_dir: Path, step: int, policy, scale: float) -> None:
    """What flowrl.checkpoint.resume.save_run writes: train/old adapter state dicts + indexed EMA shadow."""
    gen = torch.Generator().manual_seed(step)
    train = {k: v + scale * torch.randn(v.shape, generator=gen) for k, v in policy.adapter_state_dict("train").items()}
    ema = {f"{i:05d}": train[k].clone() for i, k in enumerate(train)}
    save_checkpoint(run_dir, step, {"train": train, "old": dict(train), "ema": ema}, {"loop": {"iteration": step}})


@pytest.mark.slow
def test_toy_checkpoints_side_by_side(tmp_path, toy):
    ev = _script()
    run = tmp_path / "run"
    _trainer_checkpoint(run, 3, toy, scale=0.0)   # equal to the base model (LoRA B = 0 stays 0)
    _trainer_checkpoint(run, 9, toy, scale=0.5)   # a visibly different model
    before = {k: v.clone() for k, v in toy.adapter_state_dict("train").items()}
    ev.build_policy = lambda st, cfg, device: toy  # reuse the module fixture (same tiny seed-0 weights)
    out = tmp_path / "out"
    summary = ev.main(["--policy", "toy", "--tiny", "--checkpoint", str(run / "checkpoints" / "step_00000003"),
                       str(run), "--prompts", "heldout", "--num-prompts", "2", "--seeds", "0,1",
                       "--rewards", "shapes", "--steps", "2", "--out", str(out), "--max-tile", "0"])
    assert {p.name for p in out.iterdir()} == {"grid_000.png", "index.html", "metrics.jsonl", "command.json"}
    assert set(summary) >= {"eval/base/shapes/mean", "eval/step_3/shapes/mean", "eval/step_9/shapes/mean",
                            "eval/base/palette_distance/mean"}  # the shapes prompt set's own image metric
    # checkpoint columns are checked against the base column; step_3 equals the base model, so no alarm
    step3 = {k: v for k, v in summary.items() if k.startswith("eval/step_3/alarm/")}
    assert set(step3) == {f"eval/step_3/alarm/{n}" for n in ("dark_frac", "bright_frac", "edge_density",
                                                             "color_entropy", "palette_distance", "stray_frac",
                                                             "diversity")}
    assert set(step3.values()) == {0.0} and not any(k.startswith("eval/base/alarm/") for k in summary)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["policy"] for r in recs if r["kind"] == "sample"} == {"base", "step_3", "step_9"}
    assert all(torch.equal(before[k], v) for k, v in toy.adapter_state_dict("train").items())

    from flowrl.eval.run import generate

    kw = {"steps": 2, "guidance": None, "height": 32, "width": 32, "num_frames": None, "batch_size": 8,
          "max_tile": None}
    prompts = ["a red circle", "two blue squares"]
    base, _ = generate((toy, None), prompts, [{}, {}], [0], None, **kw)
    same, _ = generate((toy, lambda: ev.checkpoint_weights(toy, run / "checkpoints" / "step_00000003")),
                       prompts, [{}, {}], [0], None, **kw)
    moved, _ = generate((toy, lambda: ev.checkpoint_weights(toy, run)), prompts, [{}, {}], [0], None, **kw)
    ema, _ = generate((toy, lambda: ev.checkpoint_weights(toy, run, "ema")), prompts, [{}, {}], [0], None, **kw)
    assert np.array_equal(base, same) and not np.array_equal(base, moved)
    assert np.array_equal(moved, ema)  # the EMA shadow here equals the train weights, in parameter order

    grid = np.asarray(Image.open(out / "grid_000.png"))
    assert grid.shape[1] > 6 * 128  # 2 seeds × 3 columns of upscaled 32-px tiles
    cmd = json.loads((out / "command.json").read_text())
    assert cmd["policy"] == "toy" and cmd["seeds"] == [0, 1] and cmd["rewards"] == ["shapes"]


def test_settings_come_from_flags_then_defaults():
    ev = _script()
    st = ev.settings(ev.parse_args(["--out", "x", "--policy", "wan", "--tiny", "--rewards", "none"]), None)
    assert (st["height"], st["width"], st["num_frames"]) == (32, 32, 5) and st["rewards"] == {}
    st = ev.settings(ev.parse_args(["--out", "x"]), None)
    assert st["policy"] == "toy" and st["prompts"] == "shapes:heldout" and st["rewards"] == {"shapes": 1.0}
    assert (st["height"], st["width"], st["seeds"], st["steps"]) == (32, 32, [0, 1], 20)


def test_missing_checkpoint_is_explained(tmp_path):
    from flowrl.checkpoint import CheckpointError

    ev = _script()
    with pytest.raises(CheckpointError, match="does not exist"):
        ev.main(["--policy", "toy", "--tiny", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])


@pytest.mark.slow
@pytest.mark.parametrize("family,grid,rewards", [("sd3", "grid_000.png", "jpeg_compressibility"),
                                                 ("flux", "grid_000.png", "jpeg_compressibility"),
                                                 ("wan", "grid_000.mp4", "none")])
def test_tiny_presets_smoke(tmp_path, family, grid, rewards):
    """The real tiny SD3 / FLUX / Wan presets through the whole script (video → MP4 grid)."""
    ev = _script()
    (tmp_path / "p.txt").write_text("a red circle\ntwo dogs on a beach\n")
    out = tmp_path / "out"
    summary = ev.main(["--policy", family, "--tiny", "--prompts", str(tmp_path / "p.txt"), "--seeds", "0,1",
                       "--rewards", rewards, "--steps", "2", "--out", str(out)])
    assert {p.name for p in out.iterdir()} == {grid, "index.html", "metrics.jsonl", "command.json"}
    monitors = {k for k in summary if k.startswith(("eval/detect/", "eval/diversity/", "eval/num_"))}
    assert (rewards == "none") == (set(summary) == monitors)  # "none": no reward scores, only the monitors
    assert "eval/detect/edge_density/mean" in summary and "eval/diversity/mean" in summary  # video: frame means
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in recs if r["kind"] == "sample"]) == 4
