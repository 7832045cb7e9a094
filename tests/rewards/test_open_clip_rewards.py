"""HPSv2, CLIPScore and temporal consistency on a tiny open_clip model (custom JSON config, random weights
saved to disk) loaded by the real loaders; preprocessing and formulas checked against direct computations."""
import pytest
import torch
import torch.nn.functional as F
from reward_tiny_models import open_clip_checkpoint, open_clip_config

from rewards import RewardSet, make_input
from rewards.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, normalize

open_clip = pytest.importorskip("open_clip")

PROMPTS = ["a red cat", "a blue dog on a hill", "text"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("openclip")
    cfg = open_clip_config(d)
    hps = open_clip_checkpoint(d, cfg, key="state_dict")
    open_clip.add_model_config(str(cfg))
    model = open_clip.create_model(cfg.stem, pretrained=None)
    model.load_state_dict(torch.load(hps)["state_dict"])
    plain = d / "plain.pt"
    torch.save(model.state_dict(), plain)
    return {"config": str(cfg), "name": cfg.stem, "hps": str(hps), "plain": str(plain),
            "model": model.eval(), "tokenizer": open_clip.get_tokenizer(cfg.stem)}


def _images(h=40, w=48):
    return torch.rand(3, 3, h, w, generator=torch.Generator().manual_seed(5))


def test_hpsv2_resize_max_size_matches_torchvision():
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    from rewards.preprocess import resize_max_size_pad

    x = _images(40, 24)  # longest side 40 → 32; 24 → round(19.2) = 19, padded 6 + 7
    ref = TF.resize(x, [32, 19], interpolation=InterpolationMode.BICUBIC, antialias=True).clamp(0, 1)
    ref = F.pad(ref, (6, 7, 0, 0))
    torch.testing.assert_close(resize_max_size_pad(x, 32), ref, atol=1e-5, rtol=0)


def test_hpsv2_formula(tiny):
    spec = {"kwargs": {"model_name": tiny["name"], "model_config": tiny["config"], "checkpoint": tiny["hps"],
                       "image_size": 32}}
    x = _images(40, 24)
    got = RewardSet.from_config({"hpsv2": spec})(make_input(x, PROMPTS)).scores[:, 0]
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    px = (x * 255).round() / 255
    px = F.pad(TF.resize(px, [32, 19], interpolation=InterpolationMode.BICUBIC, antialias=True).clamp(0, 1),
               (6, 7, 0, 0))
    px = normalize(px, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)
    with torch.no_grad():
        img, txt, _ = tiny["model"](px, tiny["tokenizer"](PROMPTS))  # open_clip returns normalised features
    torch.testing.assert_close(got, (img @ txt.T).diag(), atol=1e-5, rtol=1e-4)


def test_hpsv2_wrong_checkpoint_is_named(tiny, tmp_path):
    from rewards import RewardError

    torch.save({"state_dict": {"nope": torch.zeros(1)}}, tmp_path / "bad.pt")
    spec = {"kwargs": {"model_name": tiny["name"], "model_config": tiny["config"],
                       "checkpoint": str(tmp_path / "bad.pt")}}
    with pytest.raises(RewardError, match="reward 'hpsv2': setup"):
        RewardSet.from_config({"hpsv2": spec})(make_input(_images(), PROMPTS))


def test_clipscore_matches_open_clip_transform_and_formula(tiny):
    from PIL import Image

    spec = {"kwargs": {"model_name": tiny["name"], "model_config": tiny["config"], "pretrained": tiny["plain"],
                       "scale": 2.5, "clamp_negative": True}}
    x = _images()
    got = RewardSet.from_config({"clipscore": spec})(make_input(x, PROMPTS)).scores[:, 0]
    _, _, preprocess = open_clip.create_model_and_transforms(tiny["name"], pretrained=tiny["plain"])
    pil = [Image.fromarray((im * 255).round().byte().permute(1, 2, 0).numpy()) for im in x]
    px = torch.stack([preprocess(p) for p in pil])  # open_clip's own eval transform (PIL bicubic)
    with torch.no_grad():
        img, txt, _ = tiny["model"](px, tiny["tokenizer"](PROMPTS))
    torch.testing.assert_close(got, 2.5 * (img * txt).sum(-1).clamp(min=0), atol=0.02, rtol=0)


def _video_spec(tiny):
    return {"kwargs": {"model_name": tiny["name"], "model_config": tiny["config"], "pretrained": tiny["plain"]}}


def test_temporal_consistency_static_above_shuffled(tiny):
    g = torch.Generator().manual_seed(0)
    frame = torch.rand(3, 32, 32, generator=g)
    static = frame.expand(6, 3, 32, 32)
    # a smooth pan, and the same frames in shuffled order
    base = torch.rand(3, 32, 80, generator=g)
    pan = torch.stack([base[:, :, 4 * t: 4 * t + 32] for t in range(6)])
    shuffled = pan[torch.tensor([0, 5, 1, 4, 2, 3])]
    rs = RewardSet.from_config({"temporal_consistency": _video_spec(tiny)})
    s = rs(make_input(torch.stack([static, pan, shuffled]))).scores[:, 0]
    torch.testing.assert_close(s[0], torch.tensor(1.0), atol=1e-5, rtol=0)
    assert s[0] > s[2] and s[0] > s[1]


def test_temporal_consistency_formula(tiny):
    from rewards.clip_openclip import clip_pixels, encode_images

    v = torch.rand(2, 4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    got = RewardSet.from_config({"temporal_consistency": _video_spec(tiny)})(make_input(v)).scores[:, 0]
    with torch.no_grad():
        e = encode_images(tiny["model"], clip_pixels(tiny["model"], (v.flatten(0, 1) * 255).round() / 255,
                                                      torch.float32)).view(2, 4, -1)
    want = torch.stack([sum(e[b, f] @ e[b, f + 1] for f in range(3)) / 3 for b in range(2)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_video_frame_mean_wraps_image_reward():
    v = torch.rand(2, 5, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    v[1, 2] = 0.5  # a flat frame
    rs = RewardSet.from_config({"video_frame_mean": {"kwargs": {"reward": "jpeg_incompressibility",
                                                                "frame_stride": 2}}})
    got = rs(make_input(v)).scores[:, 0]
    from rewards.jpeg import jpeg_sizes_kb

    want = jpeg_sizes_kb(v[:, ::2].flatten(0, 1)).view(2, 3).mean(1)
    torch.testing.assert_close(got, want)
