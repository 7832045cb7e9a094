"""Image-conditioned prompts end to end: the JSONL prompt format, the engine's accepts_images gate, RewardInput's
source images, the source_fidelity reward, the evaluation grid's source column and the start-up check."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from flowrl.data.images import load_image, source_images
from flowrl.data.prompts import PromptError, load_prompts
from flowrl.types import RewardInput


@pytest.fixture
def prompt_file(tmp_path):
    (tmp_path / "img").mkdir()
    Image.fromarray(np.full((8, 12, 3), (255, 0, 0), np.uint8)).save(tmp_path / "img" / "a.png")
    Image.fromarray(np.full((8, 12, 3), (0, 0, 255), np.uint8)).save(tmp_path / "img" / "b.png")
    rows = [{"prompt": "make it blue", "image": "img/a.png", "ocr_text": "x"},
            {"prompt": "two refs", "images": ["img/a.png", "img/b.png"]},
            {"prompt": "no image"}]
    path = tmp_path / "edit.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_image_paths_resolve_relative_to_the_file(prompt_file):
    items = load_prompts(str(prompt_file)).items
    assert items[0] == ("make it blue", {"ocr_text": "x", "images": [str(prompt_file.parent / "img" / "a.png")]})
    assert len(items[1][1]["images"]) == 2 and items[2][1] == {}
    rows = source_images([m for _, m in items])
    assert rows[2] is None and [r.shape for r in rows[1]] == [(3, 8, 12)] * 2
    red = load_image(items[0][1]["images"][0])
    assert red.dtype == torch.float32 and torch.equal(red[:, 0, 0], torch.tensor([1.0, 0.0, 0.0]))
    assert source_images([{}, {"ocr_text": "y"}]) is None


@pytest.mark.parametrize("row,match", [
    ({"prompt": "p", "image": "missing.png"}, "source image not found"),
    ({"prompt": "p", "image": "a.png", "images": ["a.png"]}, "not both"),
    ({"prompt": "p", "images": "a.png"}, "list of path strings"),
])
def test_bad_image_entries_raise_one_line_errors(tmp_path, row, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(PromptError, match=match) as err:
        load_prompts(str(path))
    assert "\n" not in str(err.value) and "bad.jsonl:1" in str(err.value)


def test_engine_reads_the_flag_and_refuses_images_for_text_only_policies():
    from flowrl.policies.toy import ToyPolicy
    from samplers.engine import SampleSpec, SamplingEngine

    policy = ToyPolicy.tiny(seed=0)
    engine = SamplingEngine(policy, SampleSpec(steps=1, height=32, width=32))
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    with pytest.raises(ValueError, match="does not accept images") as err:
        engine.sample(["a", "b"], gens, images=[[torch.rand(3, 8, 8)], None])
    assert "\n" not in str(err.value)
    assert engine.sample(["a", "b"], gens, images=[None, None]).result.latents.shape[0] == 2
    with pytest.raises(ValueError, match="one entry"):
        engine.encode(["a", "b"], images=[None])


def test_reward_input_selects_source_images_and_source_fidelity_compares():
    from rewards import REWARDS

    src = [torch.zeros(3, 4, 4)]
    px = torch.stack([torch.zeros(3, 8, 8), torch.ones(3, 8, 8), torch.ones(3, 8, 8)])
    batch = RewardInput(px, ["a", "b", "c"], torch.arange(3), [{}, {}, {}], images=[src, src, None])
    assert batch.select([2, 0]).images == [None, src]
    score = REWARDS.get("source_fidelity")()(batch)
    assert score[0] == 0 and score[1] == -1 and torch.isnan(score[2])
    assert torch.isnan(REWARDS.get("source_fidelity")()(RewardInput(px, ["a"] * 3, torch.arange(3)))).all()


def test_grid_puts_the_source_column_first(tmp_path):
    from flowrl.eval.grid import source_tiles
    from flowrl.eval.run import EvalResult, write_grids

    red = torch.zeros(3, 6, 6)
    red[0] = 1
    tiles = np.zeros((2, 1, 12, 12, 3), np.uint8)                      # black results
    result = EvalResult({"policy": tiles}, {"policy": {"r": torch.zeros(2, 1)}})
    result.sources = source_tiles([[red], None], tiles.shape[2:])
    assert result.sources.shape == (2, 12, 12, 3) and (result.sources[0] == [255, 0, 0]).all()
    entries = write_grids(result, ["make it red", "no source"], [0], tmp_path)
    assert entries[0].columns == ["source", "seed 0"] and set(result.tiles) == {"policy"}
    canvas = np.asarray(Image.open(tmp_path / entries[0].file))
    assert ((canvas == [255, 0, 0]).all(-1)).sum() >= 12 * 12             # the red source tile is drawn
    video = source_tiles([[red]], (3, 12, 12, 3))
    assert video.shape == (1, 3, 12, 12, 3)


def test_startup_refuses_image_prompts_for_a_text_only_policy(prompt_file):
    from flowrl.config import load_config
    from flowrl.config.convert import ConfigError
    from flowrl.config.validate import prompts_fit_policy

    cfg = load_config(None, ["policy.kind=toy", f"data.train={prompt_file}", f"data.eval={prompt_file}"])
    with pytest.raises(ConfigError, match="does not accept images"):
        prompts_fit_policy(cfg)
    with pytest.raises(ConfigError, match="line 3 of .* has none"):       # the editing families need a source
        prompts_fit_policy(load_config(None, ["policy.kind=qwen_image_edit", f"data.train={prompt_file}"]))
    with pytest.raises(ConfigError, match="needs a source image on every prompt"):
        prompts_fit_policy(load_config(None, ["policy.kind=qwen_image_edit_plus"]))          # shapes:train
    prompts_fit_policy(load_config(None, ["policy.kind=qwen_image_edit", "data.train=configs/prompts/edit_train.jsonl",
                                          "data.eval=configs/prompts/edit_test.jsonl"]))


def test_remote_wire_carries_the_source_images():
    import io

    from rewards.wire import WireError, decode_request, encode_request

    g = torch.Generator().manual_seed(0)
    img = lambda h, w: torch.randint(0, 256, (3, h, w), generator=g).float() / 255   # noqa: E731 (8-bit exact)
    a, b, c = img(4, 6), img(5, 5), img(2, 3)
    batch = RewardInput(torch.rand(3, 3, 8, 8), ["x", "y", "z"], torch.arange(3), [{}, {}, {}],
                        images=[[a], None, [b, c]])
    back = decode_request(encode_request(batch))
    assert back.images[1] is None and [len(r) for r in (back.images[0], back.images[2])] == [1, 2]
    for got, want in zip([*back.images[0], *back.images[2]], [a, b, c], strict=True):
        assert torch.equal(got, want)
    assert decode_request(encode_request(RewardInput(batch.pixels, batch.prompts, batch.group_ids))).images is None
    buf = io.BytesIO()
    info = json.dumps({"prompts": ["x"], "images": [[7]]}).encode()
    np.savez(buf, pixels=np.zeros((1, 3, 2, 2), np.uint8), group_ids=np.zeros(1, np.int64),
             info=np.frombuffer(info, np.uint8))
    with pytest.raises(WireError, match="names sources the body does not hold"):
        decode_request(buf.getvalue())
