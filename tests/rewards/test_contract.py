"""Bad input produces one clear error naming the reward; NaN ("does not apply") is accepted."""
import math
from typing import ClassVar

import pytest
import torch

from rewards import REWARDS, RewardError, RewardInput, RewardSet, make_input
from rewards.base import check_input, nanmean, normalize_output
from rewards.compose import weighted_total


def _set(fn, **spec):
    REWARDS.register("test_fn", fn)
    try:
        return RewardSet.from_config({"test_fn": spec or 1.0})
    finally:
        REWARDS._objects.pop("test_fn", None)


def mean_pixel(batch):
    return batch.pixels.flatten(1).mean(1)


@pytest.mark.parametrize("pixels, match", [
    (torch.rand(2, 4, 8, 8), r"\(B, 3, H, W\)"),
    (torch.rand(2, 8, 8), r"\(B, 3, H, W\)"),
    (torch.rand(2, 3, 8, 8) * 2 - 1, r"\[0, 1\].*\(x \+ 1\) / 2"),
    ((torch.rand(2, 3, 8, 8) * 255).byte(), "float"),
])
def test_bad_pixels_name_the_reward(pixels, match):
    rs = _set(mean_pixel)
    with pytest.raises(RewardError, match=match) as e:
        rs(make_input(pixels))
    assert "'test_fn'" in str(e.value)


def test_prompt_count_mismatch():
    with pytest.raises(RewardError, match="2 samples but 1 prompts"):
        check_input(RewardInput(pixels=torch.rand(2, 3, 4, 4), prompts=["x"], group_ids=torch.arange(2)), "r")


def test_image_only_reward_rejects_video_with_fix():
    rs = RewardSet.from_config({"jpeg_compressibility": 1.0})
    with pytest.raises(RewardError, match="video_frame_mean"):
        rs(make_input(torch.rand(2, 3, 3, 8, 8)))


def test_unknown_name_suggests():
    with pytest.raises(RewardError, match="did you mean 'pickscore'"):
        RewardSet.from_config({"pikscore": 1.0})


def test_unknown_option_suggests():
    with pytest.raises(RewardError, match="'qualty' \\(did you mean 'quality'"):
        RewardSet.from_config({"jpeg_compressibility": {"kwargs": {"qualty": 90}}})
    with pytest.raises(RewardError, match="unknown key.*'wieght'"):
        RewardSet.from_config({"jpeg_compressibility": {"wieght": 1.0}})


def test_reward_that_raises_is_named():
    def broken(batch):
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(RewardError, match="reward 'test_fn' raised RuntimeError: CUDA out of memory"):
        _set(broken)(make_input(torch.rand(2, 3, 4, 4)))


@pytest.mark.parametrize("out", [torch.zeros(3), torch.zeros(2, 2), {"quality": torch.zeros(2)}])
def test_wrong_output_is_named(out):
    with pytest.raises(RewardError, match="reward 'test_fn'"):
        _set(lambda batch: out)(make_input(torch.rand(2, 3, 4, 4)))


def test_flow_grpo_tuple_gets_a_fix():
    with pytest.raises(RewardError, match="tuple"):
        normalize_output((torch.zeros(2), {}), 2, "r")


def test_nan_accepted_and_skipped_in_total():
    def partial(batch):
        return torch.tensor([1.0, math.nan, 3.0])

    REWARDS.register("test_partial", partial)
    try:
        rs = RewardSet.from_config({"test_partial": 2.0, "jpeg_compressibility": {"weight": 0.0}})
        out = rs(make_input(torch.rand(3, 3, 8, 8)))
    finally:
        REWARDS._objects.pop("test_partial", None)
    assert torch.isnan(out.scores[1, 0]) and not torch.isnan(out.total).any()
    torch.testing.assert_close(out.total, torch.tensor([2.0, 0.0, 6.0]))


def test_weighted_total_closed_form():
    r = torch.tensor([[1.0, 2.0], [math.nan, 4.0], [math.nan, math.nan]])
    t = weighted_total(r, torch.tensor([0.5, 2.0]))
    torch.testing.assert_close(t[:2], torch.tensor([4.5, 8.0]))
    assert torch.isnan(t[2])
    torch.testing.assert_close(nanmean(r, 1)[:2], torch.tensor([1.5, 4.0]))


def test_batches_on_device_and_returns_cpu():
    seen = []

    def record(batch):
        seen.append(len(batch))
        return batch.pixels.flatten(1).mean(1)

    rs = _set(record, batch_size=2, device="cpu")
    x = torch.rand(5, 3, 4, 4)
    out = rs(make_input(x))
    assert seen == [2, 2, 1]
    torch.testing.assert_close(out.scores[:, 0], x.flatten(1).mean(1))


def test_setup_called_once_with_device_and_dtype():
    class Lazy:
        calls: ClassVar[list] = []

        def setup(self, device, dtype):
            self.calls.append((device, dtype))

        def __call__(self, batch):
            return torch.ones(len(batch))

    REWARDS.register("test_lazy", Lazy)
    try:
        rs = RewardSet.from_config({"test_lazy": {"dtype": "bfloat16"}})
    finally:
        REWARDS._objects.pop("test_lazy", None)
    assert Lazy.calls == []          # nothing loads at build time
    rs(make_input(torch.rand(2, 3, 4, 4)))
    rs(make_input(torch.rand(2, 3, 4, 4)))
    assert Lazy.calls == [(torch.device("cpu"), torch.bfloat16)]


def test_spec_objects_and_bad_fields():
    from rewards import RewardSpec

    rs = RewardSet([RewardSpec("jpeg_compressibility", weight=2, batch_size=1)])
    assert rs.names == ["jpeg_compressibility"] and rs.weights.tolist() == [2.0]
    with pytest.raises(RewardError, match="dtype 'fp8'"):
        RewardSet({"jpeg_compressibility": RewardSpec("jpeg_compressibility", dtype="fp8")})
    with pytest.raises(RewardError, match="batch_size must be"):
        RewardSet.from_config({"jpeg_compressibility": {"batch_size": 0}})
    with pytest.raises(RewardError, match="no rewards configured"):
        RewardSet.from_config({})
