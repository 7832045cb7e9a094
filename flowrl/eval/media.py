"""Write grid canvases to disk: PNG for images, MP4 (H.264 via imageio-ffmpeg) or GIF for videos."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["VIDEO_FORMATS", "pad_to_multiple", "save_png", "save_video"]

VIDEO_FORMATS = ("mp4", "gif")


def save_png(canvas: np.ndarray, path: str | Path) -> Path:
    """(H, W, 3) uint8 → PNG file."""
    if canvas.ndim != 3 or canvas.shape[-1] != 3 or canvas.dtype != np.uint8:
        raise ValueError(f"save_png expects (H, W, 3) uint8, got {canvas.shape} {canvas.dtype}")
    path = Path(path)
    Image.fromarray(canvas).save(path)
    return path


def pad_to_multiple(frames: np.ndarray, multiple: int, value: int = 255) -> np.ndarray:
    """Pad (F, H, W, 3) at the bottom/right so H and W are multiples of ``multiple`` (H.264 needs even sizes)."""
    h, w = frames.shape[1:3]
    ph, pw = -h % multiple, -w % multiple
    if ph == 0 and pw == 0:
        return frames
    return np.pad(frames, ((0, 0), (0, ph), (0, pw), (0, 0)), constant_values=value)


def save_video(frames: np.ndarray, path: str | Path, fps: int = 8) -> Path:
    """(F, H, W, 3) uint8 → ``.mp4`` (libx264, yuv420p, sizes padded to multiples of 16) or ``.gif``."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"save_video expects (F, H, W, 3) uint8, got {frames.shape} {frames.dtype}")
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt == "gif":
        images = [Image.fromarray(f) for f in frames]
        images[0].save(path, save_all=True, append_images=images[1:], duration=max(1, round(1000 / fps)), loop=0)
        return path
    if fmt != "mp4":
        raise ValueError(f"video file {path.name!r}: format {fmt!r} not supported; use one of {VIDEO_FORMATS}")
    try:
        import imageio.v2 as imageio
    except ImportError as e:
        raise ImportError("writing MP4 needs imageio and imageio-ffmpeg (pip install imageio imageio-ffmpeg), "
                          "or choose the 'gif' video format") from e
    padded = pad_to_multiple(frames, 16)
    with imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264", quality=8,
                            pixelformat="yuv420p", macro_block_size=16) as writer:
        for f in padded:
            writer.append_data(f)
    return path
