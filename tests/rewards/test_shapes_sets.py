"""Conflicting shapes-world reward sets: specialists are NaN off their skills and equal the base reward on it;
ink budget and centring match their formulas on exact renders and hand-made tensors."""
import math

import numpy as np
import pytest
import torch

from flowrl.data.shapes import grammar, render, splits
from flowrl.data.shapes.world import BACKGROUND, MAX_OBJECTS, SIZES, PlacedShape
from rewards import RewardSet, make_input
from rewards.build import instantiate, resolve
from rewards.shapes_sets import CenteringConfig, InkConfig

PROMPTS = {"color": "a blue square", "counting": "three red circles", "position": "a green triangle on the left",
           "binding": "a red circle and a blue square", "relation": "a yellow square above a purple circle"}


def build(name, **kw):
    return instantiate(resolve(name), kw, name)


def scene(*shapes: PlacedShape) -> torch.Tensor:
    """(1, 3, 32, 32) exact render of the placed shapes."""
    return torch.from_numpy(render.render_scene(list(shapes)))[None]


def blank(n: int = 1) -> torch.Tensor:
    return torch.tensor(BACKGROUND).view(1, 3, 1, 1).expand(n, 3, 32, 32).clone()


def score(name, pixels, prompts, **kw):
    return build(name, **kw)(make_input(pixels, prompts))


@pytest.fixture(scope="module")
def one_per_skill():
    metas = [grammar.parse(p) for p in PROMPTS.values()]
    return list(PROMPTS.values()), metas, torch.from_numpy(render.render_batch(metas, seed=3))


@pytest.mark.parametrize("name,base,skills", [("shapes_count_only", "shapes_count", {"counting"}),
                                              ("shapes_position_only", "shapes_position", {"position", "relation"}),
                                              ("shapes_color_only", "shapes_color", {"color", "binding"})])
def test_specialists_are_nan_off_their_skills_and_the_base_reward_on_them(one_per_skill, name, base, skills):
    prompts, metas, px = one_per_skill
    out = build(name)(make_input(px, prompts, meta=metas))
    ref = build(base)(make_input(px, prompts, meta=metas))
    applies = torch.tensor([m["skill"] in skills for m in metas])
    assert set(out) == set(ref)
    for key, value in out.items():
        assert torch.equal(torch.isnan(value), ~applies), key
        torch.testing.assert_close(value[applies], ref[key][applies])
    assert (out["score"][applies] == 1).all()  # exact renders of their own prompts


def test_position_only_equals_shapes_position_on_the_grammar():
    items = splits.sample_prompts("train", 40, seed=2)
    metas = [m for _, m in items]
    px = torch.from_numpy(render.render_batch(metas, seed=1))
    px[::3] = px[::3].flip(-1)  # mirror a third: wrong halves / relations, so scores are not all 1
    batch = make_input(px, [p for p, _ in items], meta=metas)
    only, base = build("shapes_position_only")(batch)["score"], build("shapes_position")(batch)["score"]
    torch.testing.assert_close(only, base, equal_nan=True)
    assert (only == 0).any() and torch.isnan(only).any()


def test_count_only_graded_count_on_counting_prompts():
    cells = [(0, 0), (1, 2), (3, 1), (2, 3)]
    red = [PlacedShape("circle", "red", r, c) for r, c in cells]
    px = torch.cat([scene(*red[:3]), scene(*red[:2]), scene(*red), scene(*(PlacedShape("circle", "blue", r, c)
                                                                         for r, c in cells[:3]))])
    s = score("shapes_count_only", px, ["three red circles"] * 4)["score"]
    torch.testing.assert_close(s, torch.tensor([1.0, 1 - 1 / 3, 1 - 1 / 3, 0.0]))
    assert torch.isnan(score("shapes_count_only", px[:1], ["a red circle"])["score"]).all()  # a colour prompt


def test_color_only_recall_times_precision_on_colour_and_binding_prompts():
    px = torch.cat([scene(PlacedShape("circle", "red", 0, 0), PlacedShape("square", "green", 2, 2)),
                    scene(PlacedShape("square", "blue", 1, 1)), scene(PlacedShape("square", "blue", 1, 1))])
    out = score("shapes_color_only", px, ["a red circle and a blue square", "a blue square", "two blue squares"])
    torch.testing.assert_close(out["score"][:2], torch.tensor([0.5 * 0.5, 1.0]))  # recall 1/2 · precision 1/2
    torch.testing.assert_close(out["color_recall"][:2], torch.tensor([0.5, 1.0]))
    assert all(torch.isnan(v[2]) for v in out.values())  # counting prompt: every output n/a


def test_position_only_on_hand_placed_scenes():
    left, right = (scene(PlacedShape("triangle", "green", 1, col)) for col in (0, 3))
    s = score("shapes_position_only", torch.cat([left, right, left]),
              ["a green triangle on the left"] * 2 + ["two green triangles"])["score"]
    assert s[:2].tolist() == [1.0, 0.0] and math.isnan(s[2])


def test_ink_budget_counts_non_background_pixels():
    assert InkConfig().max_ink == MAX_OBJECTS * max(SIZES) ** 2 == 196
    squares = [PlacedShape("square", "red", r, c) for r, c in [(0, 0), (0, 2), (2, 0), (2, 2), (3, 3)]]
    faint = blank() + 0.1  # ‖0.1·(1, 1, 1)‖ = 0.17 < τ: not ink
    circle = scene(PlacedShape("circle", "purple", 1, 1, size=6))
    px = torch.cat([blank(), faint, scene(squares[0]), scene(*squares[:4]), scene(*squares), circle])
    out = score("shapes_ink_budget", px, [""] * 6)
    disc = int(render.shape_mask("circle", 6).sum())
    assert out["ink_pixels"].tolist() == [0, 0, 49, 196, 245, disc]
    torch.testing.assert_close(out["score"], torch.tensor([1.0, 1.0, 0.75, 0.0, 0.0, 1 - disc / 196]))
    half = score("shapes_ink_budget", px[2:3], [""], max_ink=98)["score"]
    torch.testing.assert_close(half, torch.tensor([0.5]))


def _block(y0: int, x0: int, side: int = 2) -> torch.Tensor:
    px = blank()
    px[0, :, y0:y0 + side, x0:x0 + side] = 1.0
    return px


def test_centering_on_exact_and_hand_made_images():
    centred = scene(PlacedShape("square", "blue", 1, 1, size=6, offset=(5, 5)))  # rows/cols 13..18: centroid 15.5
    px = torch.cat([centred, _block(15, 23), _block(15, 7), _block(0, 0), blank()])
    out = score("shapes_centering", px, [""] * 5)
    torch.testing.assert_close(out["offset_px"][:4], torch.tensor([0.0, 8.0, 8.0, 15 * math.sqrt(2)]))
    torch.testing.assert_close(out["score"], torch.tensor([1.0, 0.5, 0.5, 0.0, 0.0]))  # 15√2 > 16·1 → clamped
    assert math.isnan(out["offset_px"][4])
    assert math.isnan(score("shapes_centering", blank(), [""], blank=math.nan)["score"][0])


def test_centering_matches_a_numpy_centroid_on_rendered_scenes():
    metas = [m for _, m in splits.sample_prompts("train", 12, seed=5)]
    px = torch.from_numpy(render.render_batch(metas, seed=2))
    got = score("shapes_centering", px, [grammar.phrase(m) for m in metas])["score"]
    for img, s in zip(px.numpy(), got.tolist()):
        ys, xs = np.nonzero(np.linalg.norm(img - np.asarray(BACKGROUND)[:, None, None], axis=0) >= 0.25)
        expect = max(0.0, 1 - math.hypot(xs.mean() - 15.5, ys.mean() - 15.5) / 16)
        assert s == pytest.approx(expect, abs=1e-5)


def test_sets_conflict_as_documented():
    """Set 2: the right count costs ink, a blank image maximises ink; set 3: a correct 'left' scene is
    off-centre, so position and centring disagree on which image is better."""
    four = scene(*(PlacedShape("square", "red", r, c) for r, c in [(0, 0), (0, 3), (3, 0), (3, 3)]))
    rs = RewardSet.from_config({"shapes_count_only": 1.0, "shapes_ink_budget": 1.0})
    out = rs(make_input(torch.cat([four, blank()]), ["four red squares"] * 2))
    assert out.scores[0, 0] > out.scores[1, 0] and out.scores[0, 1] < out.scores[1, 1]
    left = scene(PlacedShape("triangle", "green", 1, 0))
    centre = scene(PlacedShape("triangle", "green", 1, 1, size=6, offset=(5, 5)))
    rs = RewardSet.from_config({"shapes_position_only": 1.0, "shapes_centering": 1.0})
    out = rs(make_input(torch.cat([left, centre]), ["a green triangle on the left"] * 2))
    assert out.scores[0, 0] > out.scores[1, 0] and out.scores[0, 1] < out.scores[1, 1]


@pytest.mark.parametrize("name", ["shapes_ink_budget", "shapes_centering"])
def test_pixel_rewards_restricted_to_skills_are_nan_elsewhere(one_per_skill, name):
    prompts, metas, px = one_per_skill
    every = build(name)(make_input(px, prompts, meta=metas))
    counting = build(name, skills=["counting"])(make_input(px, prompts, meta=metas))
    on = torch.tensor([m["skill"] == "counting" for m in metas])
    for key in every:
        assert torch.isnan(counting[key][~on]).all() and torch.equal(counting[key][on], every[key][on])
    assert not torch.isnan(every["score"]).any()
    assert build(name)(make_input(px[:1], ["not a grammar prompt"]))["score"].isfinite().all()  # no parsing


@pytest.mark.parametrize("cfg,kw,match", [(InkConfig, {"max_ink": 0}, "max_ink must be > 0"),
                                          (InkConfig, {"tau": -1.0}, "tau must be > 0"),
                                          (CenteringConfig, {"tau": 0.0}, "tau must be > 0"),
                                          (CenteringConfig, {"skills": ["colour"]}, "unknown \\['colour'\\]")])
def test_bad_options_are_refused(cfg, kw, match):
    with pytest.raises(ValueError, match=match):
        cfg(**kw)
