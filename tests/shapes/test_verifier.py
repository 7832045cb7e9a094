"""The verifier: ≥ 99 % on ground-truth renders, rejects renders of other prompts, plugin contract."""
import copy
import math

import pytest
import torch

from flowrl.data.shapes import render, splits
from flowrl.data.shapes.grammar import phrase
from flowrl.data.shapes.world import COLORS, PALETTE
from rewards import make_input
from rewards.build import instantiate, resolve

NAMES = ["shapes", "shapes_count", "shapes_color", "shapes_position", "shapes_clean"]


def build(name, **kw):
    return instantiate(resolve(name), kw, name)


@pytest.fixture(scope="module")
def ground_truth():
    items = splits.sample_prompts("heldout", 100, seed=0) + splits.sample_prompts("train", 100, seed=0)
    metas = [m for _, m in items]
    return [p for p, _ in items], metas, torch.from_numpy(render.render_batch(metas, seed=0))


def test_strict_accuracy_on_ground_truth(ground_truth):
    prompts, metas, px = ground_truth
    out = build("shapes", mode="strict")(make_input(px, prompts, meta=metas))
    assert out["score"].mean() >= 0.99
    assert out["partial"].mean() >= 0.99
    for name in NAMES[1:]:
        s = build(name)(make_input(px, prompts, meta=metas))["score"]
        assert torch.nanmean(s) >= 0.99, name


def _other_color(c):
    return COLORS[(COLORS.index(c) + 1) % len(COLORS)]


def _corrupt(meta, how):
    m = copy.deepcopy(meta)
    if how == "color":
        m["objects"][0]["color"] = _other_color(m["objects"][0]["color"])
        if len(m["objects"]) > 1 and m["objects"][1]["color"] == m["objects"][0]["color"]:
            m["objects"][1]["color"] = _other_color(m["objects"][1]["color"])
    elif how == "count":
        m["objects"][0]["count"] = m["objects"][0]["count"] % 4 + 1
    elif how == "position":
        m["position"] = {"left": "right", "right": "left", "top": "bottom", "bottom": "top"}[m["position"]]
    elif how == "relation":
        flipped = {"above": "below", "below": "above", "left of": "right of", "right of": "left of"}
        m["relation"] = flipped[m["relation"]]
    return m


@pytest.mark.parametrize("how,skills", [("color", None), ("count", ("color", "counting")),
                                        ("position", ("position",)), ("relation", ("relation",))])
def test_rejects_renders_of_a_different_prompt(how, skills):
    items = splits.sample_prompts("train", 60, seed=1, **({"skills": skills} if skills else {}))
    metas = [m for _, m in items]
    px = torch.from_numpy(render.render_batch(metas, seed=2))
    wrong = [_corrupt(m, how) for m in metas]
    out = build("shapes", mode="strict")(make_input(px, [phrase(m) for m in wrong], meta=wrong))
    assert out["score"].max() == 0.0
    assert out["partial"].max() < 1.0


def test_parses_prompts_when_meta_is_missing(ground_truth):
    prompts, metas, px = ground_truth
    with_meta = build("shapes")(make_input(px[:40], prompts[:40], meta=metas[:40]))
    without = build("shapes")(make_input(px[:40], prompts[:40]))
    assert torch.equal(with_meta["score"], without["score"])


def test_partial_credit_and_sub_scores():
    meta = splits.split_by_skill("train")["counting"][0][1]   # n objects of one kind
    px = torch.from_numpy(render.render_meta(meta, 0))[None]
    n = meta["objects"][0]["count"]
    fewer = copy.deepcopy(meta)
    fewer["objects"][0]["count"] = n + 1 if n < 4 else n - 1
    out = build("shapes")(make_input(px, [phrase(fewer)], meta=[fewer]))
    # present ✓, count ✗, extra ✗  → partial 1/3, strict 0
    assert out["score"].item() == pytest.approx(1 / 3) and out["strict"].item() == 0
    assert math.isnan(out["position"].item()) and math.isnan(out["skill_relation"].item())
    assert out["skill_counting"].item() == 0.0
    cnt = build("shapes_count")(make_input(px, [phrase(fewer)], meta=[fewer]))["score"].item()
    assert cnt == pytest.approx(1 - 1 / fewer["objects"][0]["count"])


def test_color_and_position_rewards_grade_errors():
    meta = splits.split_by_skill("train")["binding"][0][1]
    px = torch.from_numpy(render.render_meta(meta, 0))[None]
    wrong = copy.deepcopy(meta)
    taken = {o["color"] for o in meta["objects"]}
    wrong["objects"][0]["color"] = next(c for c in COLORS if c not in taken)
    out = build("shapes_color")(make_input(px, [phrase(wrong)], meta=[wrong]))
    assert out["color_recall"].item() == 0.5 and out["color_precision"].item() == 0.5
    assert out["score"].item() == 0.25
    pos = build("shapes_position")(make_input(px, [phrase(meta)], meta=[meta]))["score"]
    assert math.isnan(pos.item())  # binding prompts say nothing about position


def test_clean_background_penalises_speckle(ground_truth):
    prompts, _metas, px = ground_truth
    noisy = px[:4].clone()
    g = torch.Generator().manual_seed(0)
    speck = torch.rand(4, 1, 32, 32, generator=g) < 0.02
    noisy = torch.where(speck, torch.tensor(PALETTE["yellow"]).view(1, 3, 1, 1) * 0.5, noisy)
    clean = build("shapes_clean")(make_input(px[:4], prompts[:4]))["score"]
    dirty = build("shapes_clean", max_stray=32)(make_input(noisy, prompts[:4]))
    assert torch.all(clean == 1.0) and torch.all(dirty["score"] < 1.0)
    assert torch.allclose(dirty["score"], (1 - dirty["stray_pixels"] / 32).clamp(min=0))


def test_config_errors_are_clear():
    from rewards.base import RewardError

    with pytest.raises((ValueError, RewardError), match="strict"):
        build("shapes", mode="lenient")
    with pytest.raises(RewardError, match="did you mean"):
        build("shapes", mod="strict")
