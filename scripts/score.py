"""Score a folder of images or videos with any registered or ``module:attr`` rewards.

    python scripts/score.py --rewards pickscore,aesthetic --images out/samples --prompts prompts.txt \
        --out scores.csv [--kwargs '{"pickscore": {"divisor": 1}}'] [--device cuda] [--batch-size 16]

Images: .png .jpg .jpeg .webp .bmp; videos: .gif .mp4 .webm .mov .avi (read with imageio).  Prompts, in order
of preference: ``--prompts`` (.txt one line per file in sorted file order; .json {file: prompt} or a list;
.jsonl objects with "file", "prompt" and any metadata), then a sidecar ``<stem>.txt``, else "".
Prints a table and writes .csv or .json (by the extension of ``--out``).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rewards import RewardSet, make_input

IMAGE_EXT = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
VIDEO_EXT = {".gif", ".mp4", ".webm", ".mov", ".avi"}


def list_media(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXT | VIDEO_EXT)
    if not files:
        raise SystemExit(f"no images or videos ({', '.join(sorted(IMAGE_EXT | VIDEO_EXT))}) in {folder}")
    return files


def load_media(path: Path) -> torch.Tensor:
    """(3, H, W) for an image, (F, 3, H, W) for a video; float32 in [0, 1]."""
    if path.suffix.lower() in IMAGE_EXT:
        from PIL import Image

        arr = np.asarray(Image.open(path).convert("RGB"))
        return torch.from_numpy(arr.copy()).permute(2, 0, 1).float() / 255
    import imageio.v3 as iio

    frames = np.asarray(iio.imread(path))  # (F, H, W, C)
    if frames.ndim == 3:
        frames = frames[None]
    return torch.from_numpy(frames[..., :3].copy()).permute(0, 3, 1, 2).float() / 255


def read_prompts(files: list[Path], prompts_file: Path | None) -> tuple[list[str], list[dict]]:
    """Prompt and metadata for each file (see the module docstring for the accepted forms)."""
    names = [f.name for f in files]
    prompts: dict[str, str] = {}
    meta: dict[str, dict] = {}
    if prompts_file is not None:
        text = prompts_file.read_text()
        if prompts_file.suffix == ".jsonl":
            for line in filter(str.strip, text.splitlines()):
                row = json.loads(line)
                key = Path(row.pop("file")).name
                prompts[key] = row.pop("prompt", "")
                meta[key] = row
        elif prompts_file.suffix == ".json":
            data = json.loads(text)
            prompts = dict(zip(names, data)) if isinstance(data, list) else {Path(k).name: v
                                                                              for k, v in data.items()}
        else:
            lines = text.splitlines()
            if len(lines) < len(files):
                raise SystemExit(f"{prompts_file} has {len(lines)} lines for {len(files)} files")
            prompts = dict(zip(names, lines))
    out = []
    for f in files:
        sidecar = f.with_suffix(".txt")
        out.append(prompts.get(f.name, sidecar.read_text().strip() if sidecar.is_file() else ""))
    return out, [meta.get(n, {}) for n in names]


def score_files(rs: RewardSet, files: list[Path], prompts: list[str], meta: list[dict],
                batch_size: int) -> list[dict]:
    """One row per file: {"file", "prompt", <reward>..., <reward>/<aspect>..., "total"}; same-shape batches."""
    media = [load_media(f) for f in files]
    by_shape: dict[tuple, list[int]] = {}
    for i, m in enumerate(media):
        by_shape.setdefault(tuple(m.shape), []).append(i)
    rows: list[dict | None] = [None] * len(files)
    for idx in by_shape.values():
        for s in range(0, len(idx), batch_size):
            chunk = idx[s:s + batch_size]
            batch = make_input(torch.stack([media[i] for i in chunk]), [prompts[i] for i in chunk],
                               meta=[meta[i] for i in chunk])
            scores = rs(batch).as_dict()
            for j, i in enumerate(chunk):
                rows[i] = {"file": files[i].name, "prompt": prompts[i],
                           **{k: float(v[j]) for k, v in scores.items()}}
    return rows


def format_table(rows: list[dict]) -> str:
    cols = list(rows[0])
    cells = [[_fmt(r[c]) for c in cols] for r in rows]
    widths = [min(max(len(c), *(len(x[i]) for x in cells)), 40) for i, c in enumerate(cols)]

    def line(xs):
        return "  ".join(x[:w].ljust(w) for x, w in zip(xs, widths))

    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(c) for c in cells])


def _fmt(v) -> str:
    return ("nan" if math.isnan(v) else f"{v:.4f}") if isinstance(v, float) else str(v)


def write_rows(rows: list[dict], out: Path) -> None:
    if out.suffix == ".json":
        clean = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows]
        out.write_text(json.dumps(clean, indent=2))
        return
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rewards", required=True, help="comma-separated names or module:attr / file.py:attr")
    p.add_argument("--images", required=True, type=Path, help="folder of images or videos")
    p.add_argument("--prompts", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None, help=".csv or .json")
    p.add_argument("--kwargs", default="{}", help='JSON {"<reward>": {options}}')
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-size", type=int, default=16)
    a = p.parse_args(argv)
    kwargs = json.loads(a.kwargs)
    names = [n.strip() for n in a.rewards.split(",") if n.strip()]
    config = {n: {"kwargs": kwargs.get(n, {})} for n in names}
    files = list_media(a.images)
    prompts, meta = read_prompts(files, a.prompts)
    rows = score_files(RewardSet.from_config(config, device=a.device), files, prompts, meta, a.batch_size)
    print(format_table([{k: v for k, v in r.items() if k != "prompt"} for r in rows]))
    if a.out:
        write_rows(rows, a.out)
        print(f"wrote {len(rows)} rows to {a.out}")
    return rows


if __name__ == "__main__":
    main()
