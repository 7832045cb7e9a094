"""The video verifier: ≥ 99 % strict on ground truth, 0 on renders of a changed prompt, each check's closed-form
cases, and the reward plugin's contract."""
import copy
import math

import numpy as np
import pytest
import torch

from flowrl.data.shapes.detect import Detected
from flowrl.data.video_shapes import grammar, render, splits
from flowrl.data.video_shapes import verify as V
from flowrl.data.video_shapes.world import COLORS
from rewards import make_input
from rewards.build import instantiate, resolve

TOL = V.Tolerances()
OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up"}


def build(**kw):
    return instantiate(resolve("video_shapes"), kw, "video_shapes")


@pytest.fixture(scope="module")
def ground_truth():
    """Held-out and train prompts, their ground-truth videos and per-frame detections (detected once)."""
    items = splits.sample_prompts("heldout", 126, seed=0) + splits.sample_prompts("train", 42, seed=0)
    metas = [m for _, m in items]
    videos = torch.from_numpy(render.render_batch(metas, seed=0))
    return [p for p, _ in items], metas, videos, V.detect_video(videos)


def test_strict_on_ground_truth(ground_truth):
    _, metas, _, dets = ground_truth
    rows = [V.check_clip(d, m) for d, m in zip(dets, metas)]
    assert np.mean([r["strict"] for r in rows]) >= 0.99 and np.mean([r["partial"] for r in rows]) >= 0.99
    for s in ("motion", "speed", "bounce", "pair", "order", "appear", "sequence"):
        assert np.mean([r["strict"] for r, m in zip(rows, metas) if m["skill"] == s]) >= 0.99, s


def _changes(meta):
    """Changed prompts of ``meta``: direction reversed, order swapped, colour changed, speed changed."""
    out = []
    o = meta["objects"]
    if o[0]["direction"]:
        m = copy.deepcopy(meta)
        m["objects"][0]["direction"] = OPPOSITE[o[0]["direction"]]
        out.append(m)
    if meta["skill"] in ("order", "appear", "sequence"):
        m = copy.deepcopy(meta)
        a, b = m["objects"][:2]                                                # swap who does what
        (a["color"], a["shape"]), (b["color"], b["shape"]) = (b["color"], b["shape"]), (a["color"], a["shape"])
        out.append(m)
    m = copy.deepcopy(meta)
    m["objects"][0]["color"] = next(c for c in COLORS if c not in {x["color"] for x in o})
    out.append(m)
    if o[0]["speed"]:
        m = copy.deepcopy(meta)
        m["objects"][0]["speed"] = {"slow": "fast", "fast": "slow"}[o[0]["speed"]]
        out.append(m)
    return out


def test_changed_prompts_score_zero_strict(ground_truth):
    _, metas, _, dets = ground_truth
    pairs = [(dets[i], c) for i, m in enumerate(metas[:126]) for c in _changes(m)]
    assert len(pairs) >= 250 and all(grammar.parse(grammar.phrase(c)) == c for _, c in pairs)
    assert sum(V.check_clip(d, c)["strict"] for d, c in pairs) == 0


def track(points, shape="circle", area=30, start=0, frames=None):
    """A track of Detected at centroids ``points`` (x, y) from frame ``start``; None before."""
    dets = [Detected("red", shape, float(x), float(y), area, 0.8, 0.5) for x, y in points]
    n = frames or start + len(dets)
    return tuple([None] * start + dets + [None] * (n - start - len(dets)))


def line(dx, dy, n=8, x0=10, y0=10):
    return [(x0 + dx * f, y0 + dy * f) for f in range(n)]


def test_direction_and_static_checks():
    assert V.check_direction(track(line(2, 0)), "right", TOL)
    assert not V.check_direction(track(line(2, 0)), "left", TOL)
    assert not V.check_direction(track(line(0.4, 0)), "right", TOL)            # 2.8 px < margin 3
    assert not V.check_direction(track(line(2, 0.5)), "right", TOL)            # 3.5 px sideways > drift 2
    assert V.check_direction(track(line(0, -2)), "up", TOL)
    assert V.check_static(track(line(0.2, 0)), TOL) and not V.check_static(track(line(0.3, 0)), TOL)


def test_speed_check_thresholds_at_eight_frames():
    assert V.measured_speed(track(line(1, 0)), "right") == pytest.approx(1.0)
    assert V.check_speed(track(line(1.5, 0)), "right", "slow", 8)
    assert not V.check_speed(track(line(1.6, 0)), "right", "slow", 8)
    assert V.check_speed(track(line(2.5, 0)), "right", "fast", 8)
    assert not V.check_speed(track(line(2.4, 0)), "right", "fast", 8)
    assert not V.check_speed(track(line(-3, 0, x0=30)), "right", "fast", 8)    # fast, the wrong way


def test_bounce_check():
    out_back = [(10 + 3 * min(f, 4) - 3 * max(0, f - 4), 5) for f in range(8)]
    assert V.check_bounce(track(out_back), "right", TOL)
    assert not V.check_bounce(track(out_back), "left", TOL)
    assert not V.check_bounce(track(line(3, 0, x0=0)), "right", TOL)           # never comes back


def test_order_and_motion_time():
    first = track([(10 + 3 * min(f, 4), 5) for f in range(8)])                # moves over steps 0..3
    second = track([(20, 10 + 3 * max(0, f - 4)) for f in range(8)])          # moves over steps 4..6
    assert V.motion_time(first) == pytest.approx(2.0) and V.motion_time(second) == pytest.approx(5.5)
    assert V.check_order(first, second, 8, sequential=True)
    assert not V.check_order(second, first, 8, sequential=True)
    assert not V.check_order(first, second, 8, sequential=False)
    assert V.check_order(track(line(2, 0)), track(line(0, 2)), 8, sequential=False)
    assert math.isnan(V.motion_time(track(line(0, 0)))) and not V.check_order(first, track(line(0, 0)), 8, True)


def test_appear_check():
    a, b, c = track(line(0, 0)), track(line(0, 0, n=5), start=3), track(line(0, 0, n=2), start=6)
    assert V.check_appear([a, b, c], mover_first=False) and V.check_appear([a, b], mover_first=True)
    assert not V.check_appear([b, a], mover_first=False)
    assert not V.check_appear([b, c], mover_first=True)                        # the mover must be there at 0
    assert not V.check_appear([a, (None,) * 8], mover_first=False)             # never appears


def test_consistency_catches_flicker_swaps_and_jumps():
    assert V.check_consistent(track(line(2, 0)), TOL)
    flicker = list(track(line(2, 0)))
    flicker[4] = None
    assert not V.check_consistent(tuple(flicker), TOL)
    assert not V.check_consistent(track(line(2, 0, n=6), frames=8), TOL)      # vanishes before the end
    morph = track(line(2, 0))[:4] + track(line(2, 0, x0=18), shape="square")[:4]
    assert not V.check_consistent(morph, TOL)                                  # identity swap: the shape changes
    jump = track(line(2, 0))[:4] + track(line(2, 0, x0=26))[:4]
    assert not V.check_consistent(jump, TOL)                                   # 10-px jump between frames
    grow = track(line(2, 0), area=20)[:4] + track(line(2, 0, x0=18), area=40)[:4]
    assert not V.check_consistent(grow, TOL)


def test_tracks_and_extra():
    red = Detected("red", "circle", 5.0, 5.0, 30, 0.8, 0.5)
    speck = Detected("red", "circle", 20.0, 5.0, 9, 0.8, 0.5)
    blue = Detected("blue", "square", 5.0, 20.0, 36, 1.0, 0.5)
    (t,), clean = V.tracks([[red], [speck, red]], ["red"])
    assert t == (red, red) and not clean                                       # the second red is an extra
    assert V.tracks([[red], [red, blue]], ["red", "blue"])[1]
    assert not V.tracks([[red, blue]], ["red"])[1]                             # an unnamed colour


def test_plugin_contract_and_errors(ground_truth):
    prompts, metas, videos, _ = ground_truth
    r = build()
    out = r(make_input(videos[:3], prompts[:3]))                               # metadata parsed from the prompts
    assert out["strict"].sum() == 3 and out["palette_distance"].max() < 0.01
    assert out["score"].shape == (3,) and torch.equal(out["score"], out["partial"])
    assert {"strict", "consistent", "order", "skill_bounce", "palette_distance"} <= set(out)
    assert r.accepts == ("video",)
    with pytest.raises(ValueError, match=r"\(B, F, 3, H, W\)"):
        r(make_input(videos[:2, 0], prompts[:2]))
    with pytest.raises(ValueError, match="mode"):
        build(mode="best")
    noise = torch.rand_like(videos[:4])
    assert build(mode="strict")(make_input(noise, prompts[:4], meta=metas[:4]))["score"].sum() == 0
    assert np.isfinite(r(make_input(noise, prompts[:4], meta=metas[:4]))["partial"].numpy()).all()
