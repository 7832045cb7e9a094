"""Scene analysis against independent references (scipy.ndimage.label, closed forms)."""
import numpy as np
import pytest
import torch

from flowrl.data.shapes import detect, render, splits
from flowrl.data.shapes.world import BACKGROUND, PALETTE


def test_connected_components_match_scipy():
    ndimage = pytest.importorskip("scipy.ndimage")
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(6, 32, 32, generator=g) < 0.45
    lab = detect.connected_components(mask)
    for i in range(6):
        ref, n = ndimage.label(mask[i].numpy())  # default structure = 4-connectivity
        ours = lab[i].numpy()
        assert len(np.unique(ours[ours > 0])) == n
        # same partition: a bijection between our ids and scipy's
        pairs = {(a, b) for a, b in zip(ours[mask[i].numpy()], ref[mask[i].numpy()])}
        assert len(pairs) == n


def test_palette_distance_closed_form():
    px = torch.empty(2, 3, 32, 32)
    px[0] = torch.tensor(BACKGROUND).view(3, 1, 1)
    px[1] = torch.tensor(PALETTE["red"]).view(3, 1, 1) + torch.tensor([0.03, -0.04, 0.0]).view(3, 1, 1)
    d = detect.palette_distance(px)
    assert d[0] == pytest.approx(0.0, abs=1e-6) and d[1] == pytest.approx(0.05, abs=1e-5)


def test_detect_recovers_rendered_objects():
    items = splits.sample_prompts("heldout", 100, seed=1)
    scenes = [render.sample_scene(m, np.random.default_rng(i)) for i, (_, m) in enumerate(items)]
    px = torch.from_numpy(np.stack([render.render_scene(s) for s in scenes]))
    for scene, dets in zip(scenes, detect.detect(px)):
        want = sorted((s.color, s.shape, s.row, s.col) for s in scene)
        got = sorted((d.color, d.shape, int(d.cy // 8), int(d.cx // 8)) for d in dets)
        assert got == want


def test_stray_pixels_counts_speckle_not_objects():
    meta = splits.prompt_list("train")[0][1]
    px = torch.from_numpy(render.render_meta(meta, 0))[None].repeat(2, 1, 1, 1)
    assert detect.stray_pixels(px).tolist() == [0, 0]
    px[1, :, 0, 0] = torch.tensor([0.4, 0.1, 0.1])       # faint off-palette pixel
    px[1, :, 31, 31] = torch.tensor(PALETTE["blue"])     # 1-px palette speck (below min_area)
    assert detect.stray_pixels(px).tolist() == [0, 2]
