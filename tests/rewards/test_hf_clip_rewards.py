"""PickScore and the LAION aesthetic predictor on tiny CLIPs saved to disk and loaded by the real loaders;
preprocessing and formula checked against the processor and a direct computation on the same tensors."""
import pytest
import torch
from reward_tiny_models import PROJ, hf_clip_dir

from rewards import RewardSet, make_input
from rewards.aesthetic import AestheticMLP

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return hf_clip_dir(tmp_path_factory.mktemp("clip"))


@pytest.fixture(scope="module")
def loaded(clip_dir):
    from transformers import AutoProcessor, CLIPModel

    return CLIPModel.from_pretrained(clip_dir).eval(), AutoProcessor.from_pretrained(clip_dir)


def _images():
    g = torch.Generator().manual_seed(3)
    return torch.rand(3, 3, 40, 48, generator=g)


PROMPTS = ["a red cat", "a blue dog on a hill", "text"]


def test_preprocessing_matches_clip_processor(loaded):
    from rewards.clip_hf import pixel_values, processor_geometry

    _, processor = loaded
    x = _images()
    ours = pixel_values(x, processor_geometry(processor), quantize=True, dtype=torch.float32)
    ref = processor(images=list((x * 255).round().to(torch.uint8)), return_tensors="pt")["pixel_values"]
    assert ours.shape == ref.shape == (3, 3, 32, 32)
    # transformers resizes uint8 with torchvision's integer kernels (rounding after resize); ours stays float:
    # on average under half a grey level apart, 99% of pixels within 3 levels (in normalised units, /std)
    diff = (ours - ref).abs() * 0.27 * 255
    assert diff.mean() < 0.5
    assert diff.flatten().quantile(0.99) < 3


def test_pickscore_formula(clip_dir, loaded):
    model, processor = loaded
    rs = RewardSet.from_config({"pickscore": {"kwargs": {"model": str(clip_dir), "processor": str(clip_dir)}}})
    x = _images()
    got = rs(make_input(x, PROMPTS)).scores[:, 0]

    from rewards.clip_hf import pixel_values, processor_geometry

    px = pixel_values(x, processor_geometry(processor), True, torch.float32)
    with torch.no_grad():
        out = model(pixel_values=px, **processor.tokenizer(PROMPTS, padding=True, return_tensors="pt"))
    # CLIPModel's own logits_per_image = exp(logit_scale) · cos; PickScore divides the diagonal by 26
    torch.testing.assert_close(got, out.logits_per_image.diag() / 26, rtol=1e-4, atol=1e-5)
    # ... and with the processor's own pixels the score moves by little
    ref_px = processor(images=list((x * 255).round().to(torch.uint8)), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out2 = model(pixel_values=ref_px, **processor.tokenizer(PROMPTS, padding=True, return_tensors="pt"))
    torch.testing.assert_close(got, out2.logits_per_image.diag() / 26, rtol=0, atol=0.02)


def test_aesthetic_formula(clip_dir, loaded, tmp_path):
    model, processor = loaded
    torch.manual_seed(1)
    mlp = AestheticMLP(PROJ)
    torch.save(mlp.state_dict(), tmp_path / "mlp.pth")
    rs = RewardSet.from_config({"aesthetic": {"kwargs": {"clip": str(clip_dir),
                                                        "mlp_weights": str(tmp_path / "mlp.pth")}}})
    x = _images()
    got = rs(make_input(x)).scores[:, 0]

    from rewards.clip_hf import pixel_values, processor_geometry

    px = pixel_values(x, processor_geometry(processor), True, torch.float32)
    with torch.no_grad():
        e = model.vision_model(pixel_values=px).pooler_output @ model.visual_projection.weight.T
        want = mlp.eval()(e / e.norm(dim=-1, keepdim=True)).squeeze(1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_aesthetic_missing_weights_is_clear(clip_dir, tmp_path):
    from rewards import RewardError

    rs = RewardSet.from_config({"aesthetic": {"kwargs": {"clip": str(clip_dir),
                                                        "mlp_weights": str(tmp_path / "nope.pth")}}})
    with pytest.raises(RewardError, match="aesthetic.*not found.*improved-aesthetic-predictor"):
        rs(make_input(_images()))


def test_gradient_reaches_pixels_through_video_frame_mean(clip_dir):
    """Called raw (as reward-gradient distillation does), PickScore inside video_frame_mean is differentiable
    w.r.t. the pixels despite the uint8 rounding (straight-through)."""
    from rewards.video import FrameMeanConfig, VideoFrameMean

    r = VideoFrameMean(FrameMeanConfig(reward="pickscore", kwargs={"model": str(clip_dir),
                                                                   "processor": str(clip_dir)}))
    r.setup(torch.device("cpu"), torch.float32)
    video = torch.rand(2, 3, 3, 32, 32, generator=torch.Generator().manual_seed(0)).requires_grad_()
    out = r(make_input(video, PROMPTS[:2]))
    out["score"].sum().backward()
    assert video.grad is not None and torch.isfinite(video.grad).all() and video.grad.abs().sum() > 0
    with torch.no_grad():
        frames = r.inner(make_input(video.detach().flatten(0, 1), [p for p in PROMPTS[:2] for _ in range(3)]))
    torch.testing.assert_close(out["score"].detach(), frames.view(2, 3).mean(1))
