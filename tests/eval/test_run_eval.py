"""run_eval end to end on an analytic policy whose ODE solution is known in closed form (the decoded image is
the prompt's target x0 whatever the noise; see eval_analytic_policy.py), so a "brightness" reward equals
mean(x0) exactly; and its hacking monitors on a shapes world of ground-truth renders (eval_render_policy.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from eval_analytic_policy import AnalyticPolicy
from eval_render_policy import RenderPolicy
from PIL import Image

from flowrl.eval import EVAL_ITERATION, run_eval
from flowrl.eval.detectors import GENERIC_STATISTICS


def brightness(batch):
    return batch.pixels.flatten(1).mean(1)


def only_long(batch):
    return torch.tensor([1.0 if len(p) > 6 else float("nan") for p in batch.prompts])


PROMPTS = ["a red circle", "two blue squares", "a star", "x"]
COUNTS = {"eval/num_prompts", "eval/num_seeds"}


def detect_keys(prefix="eval/", names=GENERIC_STATISTICS):
    return {f"{prefix}detect/{n}/{s}" for n in names for s in ("mean", "std")}


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
    assert set(policy.calls) == {4.5} and set(m) == detect_keys() | COUNTS  # no rewards: monitors only
    m = run_eval({"p": policy}, PROMPTS[:1], None, [0], None, tmp_path / "c", steps=2, height=4, width=4,
                 detectors=None)
    assert m == {"eval/num_prompts": 1.0, "eval/num_seeds": 1.0}


def test_single_policy_metric_names_and_samples(tmp_path):
    policy = AnalyticPolicy()
    m = run_eval({"trained": policy}, PROMPTS[:2], None, [3], {"brightness": brightness}, tmp_path, steps=2,
                 height=4, width=4, save_samples=True)
    assert set(m) == {"eval/brightness/mean", "eval/brightness/std"} | detect_keys() | COUNTS  # 1 seed: no diversity
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
    with pytest.raises(ValueError, match="detectors 'all'"):
        run_eval({"p": p}, PROMPTS, None, [0], None, tmp_path, detectors="all")


def test_reward_set_and_dict_outputs(tmp_path):
    """A RewardSet gives one column per reward plus `total`; a callable returning {"score", aspect} gives
    `<name>` and `<name>/<aspect>`."""
    from rewards import RewardSet

    policy = AnalyticPolicy()
    rs = RewardSet({"jpeg_compressibility": 1.0, "jpeg_incompressibility": 0.5})
    m = run_eval({"p": policy}, PROMPTS[:2], None, [0], rs, tmp_path / "a", steps=2, height=16, width=16)
    assert set(m) == {f"eval/{n}/{s}" for n in ("jpeg_compressibility", "jpeg_incompressibility", "total")
                      for s in ("mean", "std")} | detect_keys() | COUNTS
    assert m["eval/total/mean"] == pytest.approx(m["eval/jpeg_compressibility/mean"]
                                                 + 0.5 * m["eval/jpeg_incompressibility/mean"], rel=1e-5)

    def scored(batch):
        b = brightness(batch)
        return {"score": b, "double": 2 * b}

    m = run_eval({"p": policy}, PROMPTS[:2], None, [0], {"lum": scored}, tmp_path / "b", steps=2, height=4, width=4)
    assert m["eval/lum/double/mean"] == pytest.approx(2 * m["eval/lum/mean"])


def test_monitors_closed_form_on_constant_images(tmp_path):
    """Constant grey images (levels 0.3–0.7): no dark/bright pixels, no edges, one colour (0 bits), and the
    exact policy lands on x0 whatever the seed, so diversity is 0. With a "base" column beside "trained", the
    trained column is checked against it and in band (a +0.2 grey shift changes none of these statistics)."""
    policy = AnalyticPolicy(shift=0.2)
    m = run_eval({"base": (policy, None), "trained": (policy, "train")}, PROMPTS, None, [0, 1], None, tmp_path,
                 steps=2, height=8, width=8)
    for lab in ("base", "trained"):
        for n in GENERIC_STATISTICS:
            assert m[f"eval/{lab}/detect/{n}/mean"] == pytest.approx(0.0, abs=1e-6)
        assert m[f"eval/{lab}/diversity/mean"] == pytest.approx(0.0, abs=1e-6)
    assert m["eval/num_prompts"] == 4.0 and m["eval/num_seeds"] == 2.0
    assert {k: v for k, v in m.items() if "/alarm/" in k} == {
        f"eval/trained/alarm/{n}": 0.0 for n in (*GENERIC_STATISTICS, "diversity")}
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    per_prompt = [r for r in lines if r["kind"] == "prompt"]
    assert len(per_prompt) == 2 * 4 and all(r["diversity"] == pytest.approx(0.0, abs=1e-6) for r in per_prompt)
    sample = next(r for r in lines if r["kind"] == "sample")
    assert set(sample["scores"]) == {f"detect/{n}" for n in GENERIC_STATISTICS}
    page = (tmp_path / "index.html").read_text()
    assert "Drift alarms: none" in page and "DRIFT ALARM" not in page and "<th>diversity</th>" in page


def test_seed_diversity_of_noisy_samples(tmp_path):
    """The inexact analytic policy's samples depend on the noise: diversity > 0, and equal to seed_diversity of
    the saved samples (8-bit PNGs, so to within quantisation)."""
    from flowrl.eval import seed_diversity

    policy = AnalyticPolicy(exact=False)
    m = run_eval({"p": policy}, PROMPTS[:2], None, [0, 1, 2], None, tmp_path, steps=3, height=8, width=8,
                 save_samples=True)
    files = sorted((tmp_path / "samples" / "p").iterdir())
    imgs = torch.stack([torch.from_numpy(np.array(Image.open(f))).permute(2, 0, 1).float() / 255 for f in files])
    ids = [int(f.name[1:5]) for f in files]
    assert m["eval/diversity/mean"] > 0.01
    assert m["eval/diversity/mean"] == pytest.approx(seed_diversity(imgs, ids), abs=2e-3)


def _shapes_eval(tmp_path, tag, policy, seeds, base=None):
    from flowrl.data.prompts import ShapesSource

    source = ShapesSource("heldout")
    items = source.fixed(16)
    return run_eval({"trained": policy}, [p for p, _ in items], [m for _, m in items], seeds,
                    source.eval_metrics(), tmp_path / tag, steps=1, height=32, width=32, batch_size=16,
                    base_stats=base)


def _speckle(pixels):
    """Off-palette dots on every 3rd row and 5th column where the background is (CleanBackgroundReward's hack)."""
    out = pixels.clone()
    bg = (pixels - torch.tensor([0.08, 0.08, 0.10]).view(1, 3, 1, 1)).norm(dim=1) < 0.05
    dots = torch.zeros_like(bg)
    dots[:, ::3, ::5] = True
    return torch.where((bg & dots).unsqueeze(1), torch.tensor([0.45, 0.35, 0.15]).view(1, 3, 1, 1), out)


def test_drift_alarms_quiet_across_seeds_and_firing_on_hacks(tmp_path):
    """Base: shapes-world renders with seeds 0–2. The same model with seeds 3–5 raises no alarm; speckled
    backgrounds, darkened images and seed-collapsed sampling each raise theirs, and the gallery says so."""
    base = _shapes_eval(tmp_path, "base", RenderPolicy(), [0, 1, 2])
    assert "eval/palette_distance/mean" in base and not any("detect/palette_distance" in k for k in base)
    same = _shapes_eval(tmp_path, "same", RenderPolicy(), [3, 4, 5], base)
    alarms = {k.split("/")[-1]: v for k, v in same.items() if k.startswith("eval/alarm/")}
    assert alarms == {n: 0.0 for n in (*GENERIC_STATISTICS, "palette_distance", "stray_frac", "diversity")}
    assert "Drift alarms: none" in (tmp_path / "same" / "index.html").read_text()

    def fired(summary):
        return {k.split("/")[-1] for k, v in summary.items() if k.startswith("eval/alarm/") and v == 1.0}

    speckled = _shapes_eval(tmp_path, "speckle", RenderPolicy(decode_hack=_speckle), [3, 4, 5], base)
    assert {"stray_frac", "palette_distance", "edge_density"} <= fired(speckled) <= {
        "stray_frac", "palette_distance", "edge_density", "color_entropy"}
    dark = _shapes_eval(tmp_path, "dark", RenderPolicy(decode_hack=lambda x: 0.5 * x), [3, 4, 5], base)
    assert "dark_frac" in fired(dark) and "bright_frac" not in fired(dark)
    collapsed = _shapes_eval(tmp_path, "collapse", RenderPolicy(collapse=True), [3, 4, 5], base)
    assert fired(collapsed) == {"diversity"} and collapsed["eval/diversity/mean"] == pytest.approx(0, abs=1e-6)
    page = (tmp_path / "collapse" / "index.html").read_text()
    assert "class='alarm'>&#9888; DRIFT ALARM: trained: diversity = " in page and "is below its band" in page
