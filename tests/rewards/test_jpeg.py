import io

import torch
from PIL import Image

from rewards import RewardSet, make_input
from rewards.jpeg import jpeg_sizes_kb


def _flat_and_noise():
    flat = torch.full((1, 3, 64, 64), 0.5)
    noise = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    return torch.cat([flat, noise])


def test_size_matches_pil_directly():
    x = _flat_and_noise()
    img = Image.fromarray((x[1] * 255).round().byte().permute(1, 2, 0).numpy())
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=95)
    assert abs(jpeg_sizes_kb(x)[1].item() - buf.tell() / 1000) < 1e-5


def test_compressibility_ranks_flat_above_noise_and_incompressibility_reverse():
    rs = RewardSet.from_config({"jpeg_compressibility": 1.0, "jpeg_incompressibility": 1.0})
    out = rs(make_input(_flat_and_noise()))
    comp, incomp = out.scores[:, 0], out.scores[:, 1]
    assert comp[0] > comp[1] and incomp[1] > incomp[0]
    torch.testing.assert_close(comp, -incomp)
    torch.testing.assert_close(out.total, torch.zeros(2))


def test_flow_grpo_scale():
    rs = RewardSet.from_config({"jpeg_compressibility": {"kwargs": {"scale": 1 / 500}}})
    x = _flat_and_noise()
    torch.testing.assert_close(rs(make_input(x)).scores[:, 0], -jpeg_sizes_kb(x) / 500)
