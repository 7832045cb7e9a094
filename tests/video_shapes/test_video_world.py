"""The moving-shapes world: grammar round trip, held-out split, deterministic renderer."""
import re

import numpy as np
import pytest

from flowrl.data.video_shapes import grammar, render, splits
from flowrl.data.video_shapes.world import BACKGROUND, SKILLS


def test_parse_inverts_phrase_on_the_whole_grammar():
    metas = [m for ms in grammar.all_prompts().values() for m in ms]
    assert len(metas) == 60 + 120 + 60 + 1920 + 1920 + 480 + 360
    assert all(grammar.parse(grammar.phrase(m)) == m for m in metas)
    assert len({grammar.phrase(m) for m in metas}) == len(metas)


def test_issue_examples_parse():
    m = grammar.parse("A blue square falls, then a green triangle appears.")
    assert m["skill"] == "appear" and m["objects"][0]["direction"] == "down" and m["objects"][1]["direction"] is None
    assert grammar.parse("a red circle moving right")["objects"][0]["direction"] == "right"


def test_unknown_prompt_is_one_line_error():
    with pytest.raises(ValueError, match="not in the moving-shapes grammar"):
        grammar.parse("a red circle dancing")


def test_split_holds_out_unseen_compositions_of_seen_words():
    held, train = splits.prompt_list("heldout"), splits.prompt_list("train")
    sizes = {s: len(v) for s, v in splits.split_by_skill("heldout").items()}
    assert sizes == {"motion": 12, "speed": 24, "bounce": 12, "pair": 40, "order": 40, "appear": 40, "sequence": 40}
    assert not {p for p, _ in held} & {p for p, _ in train}
    words = lambda items: {w for p, _ in items for w in re.findall(r"\w+|,", p)}  # noqa: E731
    assert words(held) <= words(train)
    assert splits.prompt_list("heldout") == held          # a pure function of the grammar
    with pytest.raises(ValueError, match="unknown moving-shapes split"):
        splits.prompt_list("test")


def test_sample_prompts_balanced_and_reproducible():
    a = splits.sample_prompts("train", 70, seed=3)
    assert a == splits.sample_prompts("train", 70, seed=3) != splits.sample_prompts("train", 70, seed=4)
    counts = {s: sum(m["skill"] == s for _, m in a) for s in SKILLS}
    assert set(counts.values()) == {10}
    stream = splits.VideoShapesPrompts("train", seed=1)
    assert stream.batch(5, 8) == stream.batch(5, 8) and len(stream) == len(splits.prompt_list("train"))


def test_renderer_is_deterministic_and_per_row():
    metas = [m for _, m in splits.sample_prompts("train", 7, seed=0)]
    v = render.render_batch(metas, seed=11)
    assert v.shape == (7, 8, 3, 32, 32) and v.dtype == np.float32 and 0 <= v.min() and v.max() <= 1
    assert np.array_equal(v, render.render_batch(metas, seed=11))
    assert np.array_equal(v[3], render.render_batch(metas, seed=11)[3])
    assert not np.array_equal(v, render.render_batch(metas, seed=12))
    row = render.render_clip(render.sample_clip(metas[3], np.random.default_rng([11, 3])))
    assert np.array_equal(v[3], row)
    assert np.allclose(np.median(v[:, 0].reshape(7, 3, -1), axis=2), BACKGROUND)   # mostly background


def test_renderer_motion_follows_the_prompt():
    m = grammar.parse("a red square moving right quickly")
    clip = render.sample_clip(m, np.random.default_rng(0))
    xs = [c[1] for c in clip[0].corners]
    assert np.all(np.diff(xs) == 3) and len({c[0] for c in clip[0].corners}) == 1
    m = grammar.parse("a red square falls, then a blue circle appears")
    a, b = render.sample_clip(m, np.random.default_rng(0))
    assert b.corners[0] is None and b.corners[-1] is not None and a.corners[0] is not None


def test_renderer_other_sizes_and_bad_sizes():
    m = grammar.parse("a red circle rising slowly")
    assert render.render_meta(m, 0, frames=16, size=48).shape == (16, 3, 48, 48)
    with pytest.raises(ValueError, match="need ≥ 4 frames"):
        render.render_meta(m, 0, frames=2)
