"""The trainer's ``video_shapes:`` prompt source: the split's prompts with the metadata the verifier reads, balanced
reproducible batches, a fixed evaluation set, the palette-distance eval metric on videos, one-line config errors."""
import pytest
import torch

from flowrl.config.validate import ConfigError, check_prompt_source
from flowrl.data.prompts import PromptError, load_prompts
from flowrl.data.video_shapes import grammar, render, splits
from rewards import make_input
from rewards.video_shapes import VideoShapesVerifier, metas_of


def test_heldout_source_is_the_split_with_its_metadata():
    src = load_prompts("video_shapes:heldout", seed=0)
    assert len(src) == 208
    items = src.fixed(None)
    assert items == splits.prompt_list("heldout")
    assert all(grammar.parse(p) == m for p, m in items)
    spread = src.fixed(14)
    assert len(spread) == 14 and {m["skill"] for _, m in spread} == set(grammar.SKILLS)


def test_train_batches_are_reproducible_balanced_and_train_only():
    src = load_prompts("video_shapes:train", seed=3)
    a, b = src.batch(5, 14), load_prompts("video_shapes:train", seed=3).batch(5, 14)
    assert a == b and a != src.batch(6, 14)
    assert sorted(m["skill"] for _, m in a) == sorted(list(grammar.SKILLS) * 2)
    held = {p for p, _ in splits.prompt_list("heldout")}
    assert not held & {p for p, _ in a}


def test_reward_reads_the_source_metadata_not_the_prompt():
    (prompt, meta), = load_prompts("video_shapes:heldout").fixed(1)
    video = torch.from_numpy(render.render_batch([meta], seed=0))
    other = "a red circle moving left" if prompt != "a red circle moving left" else "a blue square rising"
    batch = make_input(video, [other], meta=[meta])
    assert metas_of(batch) == [meta]                         # metadata wins over the (changed) prompt text
    assert VideoShapesVerifier()(batch)["strict"].item() == 1.0
    parsed = make_input(video, [other])
    assert metas_of(parsed) == [grammar.parse(other)]        # no metadata: the prompt is parsed


def test_palette_metric_on_videos_is_the_mean_over_frames():
    from flowrl.data.shapes.detect import palette_distance

    metas = [m for _, m in load_prompts("video_shapes:heldout").fixed(2)]
    video = torch.from_numpy(render.render_batch(metas, seed=1))
    metric = load_prompts("video_shapes:heldout").eval_metrics()["palette_distance"]
    per_frame = palette_distance(video.reshape(-1, *video.shape[2:])).view(2, -1).mean(1)
    got = metric(make_input(video, ["x", "y"]))
    assert got.shape == (2,) and torch.allclose(got, per_frame) and float(got.max()) < 0.02


@pytest.mark.parametrize("src", ["video_shapes:test", "video_shapes:"])
def test_unknown_split_is_a_one_line_error(src):
    with pytest.raises((PromptError, ConfigError)) as e:
        check_prompt_source("data.eval", src)
        load_prompts(src)
    assert "\n" not in str(e.value)
