"""scripts/score.py scores a folder of images / videos with registered and module:attr rewards."""
import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rewards.jpeg import jpeg_sizes_kb

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "score.py"


@pytest.fixture(scope="module")
def score():
    spec = importlib.util.spec_from_file_location("score_cli", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _save(folder: Path):
    rng = np.random.default_rng(0)
    Image.fromarray(np.full((32, 32, 3), 128, np.uint8)).save(folder / "a_flat.png")
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / "b_noise.png")
    Image.fromarray(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)).save(folder / "c_small.png")
    (folder / "c_small.txt").write_text('a sign "hi"')  # sidecar prompt


def test_images_csv_and_module_attr(score, tmp_path):
    _save(tmp_path)
    plugin = tmp_path / "plug.py"
    plugin.write_text("def red(batch):\n    return batch.pixels[:, 0].mean((1, 2))\n")
    (tmp_path / "prompts.json").write_text(json.dumps({"a_flat.png": "grey", "b_noise.png": "noise"}))
    out = tmp_path / "scores.csv"
    rows = score.main(["--rewards", f"jpeg_compressibility,{plugin}:red", "--images", str(tmp_path),
                       "--prompts", str(tmp_path / "prompts.json"), "--out", str(out), "--batch-size", "1"])
    assert [r["file"] for r in rows] == ["a_flat.png", "b_noise.png", "c_small.png"]
    assert [r["prompt"] for r in rows] == ["grey", "noise", 'a sign "hi"']
    assert rows[0]["jpeg_compressibility"] > rows[1]["jpeg_compressibility"]
    x = torch.from_numpy(np.array(Image.open(tmp_path / "b_noise.png"))).permute(2, 0, 1)[None].float() / 255
    assert rows[1]["jpeg_compressibility"] == pytest.approx(-jpeg_sizes_kb(x).item(), abs=1e-5)
    assert rows[0][f"{plugin}:red"] == pytest.approx(128 / 255, abs=1e-6)
    with out.open() as fh:
        written = list(csv.DictReader(fh))
    assert len(written) == 3 and set(written[0]) >= {"file", "prompt", "jpeg_compressibility", "total"}


def test_video_json(score, tmp_path, capsys):
    import imageio.v3 as iio

    frames = np.random.default_rng(1).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    iio.imwrite(tmp_path / "clip.gif", frames)
    out = tmp_path / "scores.json"
    rows = score.main(["--rewards", "video_frame_mean", "--images", str(tmp_path), "--out", str(out),
                       "--kwargs", json.dumps({"video_frame_mean": {"reward": "jpeg_incompressibility"}})])
    back = json.loads(out.read_text())
    assert back[0]["file"] == "clip.gif" and back[0]["video_frame_mean"] == pytest.approx(rows[0]["total"])
    assert "video_frame_mean" in capsys.readouterr().out
