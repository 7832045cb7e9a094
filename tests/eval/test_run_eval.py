"""run_eval end to end on an analytic policy whose ODE solution is known in closed form (the decoded image is
the prompt's target x0 whatever the noise; see eval_analytic_policy.py), so a "brightness" reward equals
mean(x0) exactly."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from eval_analytic_policy import AnalyticPolicy
from PIL import Image

from flowrl.eval import EVAL_ITERATION, run_eval


def brightness(batch):
    return batch.pixels.flatten(1).mean(1)


def only_long(batch):
    return torch.tensor([1.0 if len(p) > 6 else float("nan") for p in batch.prompts])


PROMPTS = ["a red circle", "two blue squares", "a star", "x"]


def test_closed_form_scores_files_and_metrics(tmp_path):
    policy = AnalyticPolicy(shift=0.2)
    metrics = run_eval({"base": (policy, None), "trained": (policy, "train")}, PROMPTS, None, [0, 1],
                       {"brightness": brightness, "only_long": only_long}, tmp_path, steps=4, height=8, width=8,
                       batch_size=3, rows_per_page=3, step=7)
    levels = torch.tensor([policy.level(p) for p in PROMPTS])
    assert metrics["eval/base/brightness/mean"] == pytest.approx(levels.mean().item(), abs=1e-5)
    assert metrics["eval/trained/brightness/mean"] == pytest.approx((levels + 0.2).clamp(max=1).mean().item(),
                                                                     abs=1e-5)
    assert metrics["eval/base/only_long/mean"] == 1.0  # NaN (does not apply) is left out of the mean
    assert {p.name for p in tmp_path.iterdir()} == {"grid_000.png", "grid_001.png", "metrics.jsonl", "index.html"}

    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    samples = [r for r in lines if r["kind"] == "sample"]
    assert len(samples) == 2 * len(PROMPTS) * 2 and lines[-1]["kind"] == "summary"
    assert lines[-1]["metrics"]["eval/trained/brightness/mean"] == pytest.approx(
        metrics["eval/trained/brightness/mean"])
    rec = next(r for r in samples if r["policy"] == "trained" and r["prompt_idx"] == 1 and r["seed"] == 1)
    assert rec["prompt"] == PROMPTS[1] and rec["step"] == 7
    assert rec["scores"]["brightness"] == pytest.approx(min(levels[1].item() + 0.2, 1.0), abs=1e-5)
    assert next(r for r in samples if r["prompt_idx"] == 3)["scores"]["only_long"] is None

    page = (tmp_path / "index.html").read_text()
    assert 'src="grid_000.png"' in page and 'src="grid_001.png"' in page and "two blue squares" in page
    grid = np.asarray(Image.open(tmp_path / "grid_000.png"))
    assert grid.ndim == 3 and grid.shape[1] > 4 * 128  # 4 columns (2 seeds × 2 policies) of upscaled tiles


def test_same_noise_for_every_policy_and_run(tmp_path):
    """Evaluation noise depends only on (seed, prompt index): repeated runs and policies agree bit for bit."""
    from flowrl.eval.run import generate
    from samplers.rng import sample_generator

    policy = AnalyticPolicy(exact=False)
    kw = {"steps": 3, "guidance": None, "height": 4, "width": 4, "num_frames": None, "max_tile": None}
    a, _ = generate(policy, PROMPTS, [{}] * 4, [0, 5], None, batch_size=8, **kw)
    b, _ = generate(policy, PROMPTS, [{}] * 4, [0, 5], None, batch_size=1, **kw)
    assert np.array_equal(a, b)  # batch composition does not matter
    assert not np.array_equal(a[:, 0], a[:, 1])  # different seeds, different noise
    x1 = policy.noise([sample_generator(5, EVAL_ITERATION, 1, 0)], 4, 4)
    seen = []
    policy.velocity = lambda x, s, c, g=None, f=policy.velocity: (seen.append(x.clone()), f(x, s, c, g))[1]
    generate(policy, PROMPTS[:2], [{}] * 2, [5], None, batch_size=1, **kw)
    assert torch.equal(seen[3], x1)  # 3 steps per sample: call 3 starts prompt 1's (seed, EVAL_ITERATION, 1, 0)


def test_guidance_default_and_override(tmp_path):
    policy = AnalyticPolicy()
    run_eval({"p": policy}, PROMPTS[:1], None, [0], None, tmp_path / "a", steps=2, height=4, width=4)
    assert set(policy.calls) == {1.0}
    policy.calls.clear()
    m = run_eval({"p": policy}, PROMPTS[:1], None, [0], None, tmp_path / "b", steps=2, height=4, width=4,
                 guidance=4.5)
    assert set(policy.calls) == {4.5} and m == {}


def test_single_policy_metric_names_and_samples(tmp_path):
    policy = AnalyticPolicy()
    m = run_eval({"trained": policy}, PROMPTS[:2], None, [3], {"brightness": brightness}, tmp_path, steps=2,
                 height=4, width=4, save_samples=True)
    assert set(m) == {"eval/brightness/mean", "eval/brightness/std"}
    assert sorted(p.name for p in (tmp_path / "samples" / "trained").iterdir()) == ["p0000_s3.png", "p0001_s3.png"]


@pytest.mark.parametrize("fmt", ["mp4", "gif"])
def test_video_policy_writes_video_grid(tmp_path, fmt):
    policy = AnalyticPolicy(video_frames=3)
    m = run_eval({"base": (policy, None), "trained": (policy, "train")}, PROMPTS[:2], None, [0],
                 {"brightness": brightness}, tmp_path, steps=2, height=8, width=8, num_frames=3,
                 video_format=fmt, fps=4)
    assert (tmp_path / f"grid_000.{fmt}").is_file() and "eval/trained/brightness/mean" in m
    tag = "<video" if fmt == "mp4" else "<img"
    assert f'{tag} src="grid_000.{fmt}"' in (tmp_path / "index.html").read_text()
    if fmt == "gif":
        assert Image.open(tmp_path / "grid_000.gif").n_frames == 3


def test_bad_arguments_are_explained(tmp_path):
    p = AnalyticPolicy()
    with pytest.raises(ValueError, match="no policies"):
        run_eval({}, PROMPTS, None, [0], None, tmp_path)
    with pytest.raises(ValueError, match="no seeds"):
        run_eval({"p": p}, PROMPTS, None, [], None, tmp_path)
    with pytest.raises(ValueError, match="2 metadata dicts for 4 prompts"):
        run_eval({"p": p}, PROMPTS, [{}, {}], [0], None, tmp_path)
    with pytest.raises(ValueError, match="video_format 'avi'"):
        run_eval({"p": p}, PROMPTS, None, [0], None, tmp_path, video_format="avi")
    with pytest.raises(ValueError, match="contain no '/'"):
        run_eval({"a/b": p}, PROMPTS, None, [0], None, tmp_path)


def test_reward_set_and_dict_outputs(tmp_path):
    """A RewardSet gives one column per reward plus `total`; a callable returning {"score", aspect} gives
    `<name>` and `<name>/<aspect>`."""
    from rewards import RewardSet

    policy = AnalyticPolicy()
    rs = RewardSet({"jpeg_compressibility": 1.0, "jpeg_incompressibility": 0.5})
    m = run_eval({"p": policy}, PROMPTS[:2], None, [0], rs, tmp_path / "a", steps=2, height=16, width=16)
    assert set(m) == {f"eval/{n}/{s}" for n in ("jpeg_compressibility", "jpeg_incompressibility", "total")
                      for s in ("mean", "std")}
    assert m["eval/total/mean"] == pytest.approx(m["eval/jpeg_compressibility/mean"]
                                                 + 0.5 * m["eval/jpeg_incompressibility/mean"], rel=1e-5)

    def scored(batch):
        b = brightness(batch)
        return {"score": b, "double": 2 * b}

    m = run_eval({"p": policy}, PROMPTS[:2], None, [0], {"lum": scored}, tmp_path / "b", steps=2, height=4, width=4)
    assert m["eval/lum/double/mean"] == pytest.approx(2 * m["eval/lum/mean"])
