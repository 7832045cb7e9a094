"""Verifier of moving-shapes videos: per-frame detection (the image world's ``detect``), colour tracks across
frames, and pure checks of the prompt's motion and timing.

Tracking: every object of a clip has its own palette colour, so the track of colour c is, per frame, the largest
detected component of colour c (None where there is none); any other component in a frame is an extra object.
With p_f the track's centroid along the named axis (signed so that the named direction is positive), q_f across
it, Δ_f = ‖centroid_{f+1} − centroid_f‖, over the frames where the track is present:

    present     present in the last frame and the named shape in ≥ half its frames
    extra       no frame holds a component beyond one per named colour
    consistent  (no flicker, no identity swap) present from its first frame to the last without a gap, one shape
                class in every frame, Δ_f ≤ max_step, area max/min ≤ max_area_ratio
    direction   p_last − p_first ≥ margin and max_f |q_f − q_first| ≤ drift
    static      max_f ‖centroid_f − centroid_first‖ ≤ static_tol
    speed       v = (p_last − p_first)/(n − 1):  slow iff v ≤ (v_slow + v_normal)/2, fast iff v ≥ (v_normal + v_fast)/2
    bounce      m = argmax_f p_f with p_m − p_first ≥ margin and p_m − p_last ≥ margin (out, then back)
    order       motion time t = Σ_f (f + ½)Δ_f / Σ_f Δ_f:  "then": t_2 − t_1 ≥ (F−1)/4;  "and": |t_2 − t_1| < (F−1)/4
    appear      first frames strictly increasing in prompt order (appear: the mover is there at frame 0)

strict = 1[all checks pass], partial = mean of the checks (per-object checks count once per object).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flowrl.data.video_shapes.world import axis_sign, speed_px

Track = tuple  # per frame: a flowrl.data.shapes.detect.Detected or None

CHECKS = ("present", "extra", "consistent", "direction", "static", "speed", "bounce", "order", "appear")
STATIC_SKILLS = {"appear": (1,), "sequence": (0, 1, 2)}


@dataclass(frozen=True)
class Tolerances:
    """Thresholds of the checks, in px (see the module docstring)."""

    margin: float = 3.0          # least travel of a moving object (slow travel is 7 px over a clip)
    drift: float = 2.0           # most sideways wander of a moving object
    static_tol: float = 1.5      # most wander of a still object
    max_step: float = 5.5        # most centroid jump between frames (fast is 3 px/frame at 8 frames)
    max_area_ratio: float = 1.8  # most area change along a track


def tracks(frames_dets: list[list], colors: list[str]) -> tuple[list[Track], bool]:
    """(one track per named colour, extra) from the per-frame detections of one video: the largest component of
    that colour per frame; extra = False when some frame holds any other component."""
    out = [[] for _ in colors]
    clean = True
    for dets in frames_dets:
        for j, c in enumerate(colors):
            mine = [d for d in dets if d.color == c]
            out[j].append(max(mine, key=lambda d: d.area) if mine else None)
        clean &= len(dets) == sum(o is not None for o in (t[-1] for t in out))
    return [tuple(t) for t in out], clean


def _present(track: Track) -> list:
    return [d for d in track if d is not None]


def _xy(dets: list) -> np.ndarray:
    return np.array([[d.cx, d.cy] for d in dets], dtype=np.float64).reshape(-1, 2)


def _along_across(dets: list, direction: str) -> tuple[np.ndarray, np.ndarray]:
    axis, sign = axis_sign(direction)
    xy = _xy(dets)
    return sign * xy[:, axis], xy[:, 1 - axis]


def first_frame(track: Track) -> int | None:
    """Index of the first frame the track is present in (None if never)."""
    return next((f for f, d in enumerate(track) if d is not None), None)


def check_present(track: Track, shape: str) -> bool:
    """Present in the last frame and the named shape in at least half of its frames."""
    dets = _present(track)
    return track[-1] is not None and 2 * sum(d.shape == shape for d in dets) >= len(dets)


def check_consistent(track: Track, tol: Tolerances) -> bool:
    """No gap from the first frame to the last, one shape class, bounded jumps and area changes."""
    f0 = first_frame(track)
    if f0 is None or any(d is None for d in track[f0:]):
        return False
    dets = list(track[f0:])
    if len({d.shape for d in dets}) != 1:
        return False
    steps = np.linalg.norm(np.diff(_xy(dets), axis=0), axis=1)
    areas = [d.area for d in dets]
    return bool((steps <= tol.max_step).all()) and max(areas) <= tol.max_area_ratio * min(areas)


def check_direction(track: Track, direction: str, tol: Tolerances) -> bool:
    """Net travel ≥ margin in the named direction, sideways wander ≤ drift."""
    dets = _present(track)
    if len(dets) < 2:
        return False
    p, q = _along_across(dets, direction)
    return p[-1] - p[0] >= tol.margin and float(np.abs(q - q[0]).max()) <= tol.drift


def check_static(track: Track, tol: Tolerances) -> bool:
    """Every centroid within static_tol of the first one."""
    xy = _xy(_present(track))
    return len(xy) >= 1 and float(np.linalg.norm(xy - xy[0], axis=1).max()) <= tol.static_tol


def measured_speed(track: Track, direction: str) -> float:
    """Mean speed along the named direction, px per frame ((p_last − p_first)/(n − 1); NaN under 2 frames)."""
    dets = _present(track)
    if len(dets) < 2:
        return math.nan
    p, _ = _along_across(dets, direction)
    return float(p[-1] - p[0]) / (len(dets) - 1)


def check_speed(track: Track, direction: str, speed: str, frames: int, size: int = 32) -> bool:
    """slow: v ≤ midpoint of slow and normal speed; fast: v ≥ midpoint of normal and fast speed."""
    v = measured_speed(track, direction)
    if speed == "slow":
        return v <= (speed_px("slow", frames, size) + speed_px("normal", frames, size)) / 2
    return v >= (speed_px("normal", frames, size) + speed_px("fast", frames, size)) / 2


def check_bounce(track: Track, direction: str, tol: Tolerances) -> bool:
    """Out in the named direction by ≥ margin, then back by ≥ margin."""
    dets = _present(track)
    if len(dets) < 3:
        return False
    p, _ = _along_across(dets, direction)
    m = int(p.argmax())
    return p[m] - p[0] >= tol.margin and p[m] - p[-1] >= tol.margin


def motion_time(track: Track) -> float:
    """Displacement-weighted mean time of a track's motion, Σ (f + ½)Δ_f / Σ Δ_f (NaN when it never moves)."""
    f0 = first_frame(track)
    if f0 is None:
        return math.nan
    pts = [(f, d) for f, d in enumerate(track) if d is not None]
    xy = _xy([d for _, d in pts])
    steps = np.linalg.norm(np.diff(xy, axis=0), axis=1)
    mids = np.array([(a + b) / 2 for (a, _), (b, _) in zip(pts[:-1], pts[1:])])
    return float((steps * mids).sum() / steps.sum()) if len(steps) and steps.sum() > 0 else math.nan


def check_order(first: Track, second: Track, frames: int, sequential: bool) -> bool:
    """sequential ("then"): t_2 − t_1 ≥ (F−1)/4; simultaneous ("and"): |t_2 − t_1| < (F−1)/4."""
    gap = motion_time(second) - motion_time(first)
    if math.isnan(gap):
        return False
    return gap >= (frames - 1) / 4 if sequential else abs(gap) < (frames - 1) / 4


def check_appear(track_list: list[Track], mover_first: bool) -> bool:
    """First frames strictly increasing in prompt order; with ``mover_first`` the first object is there at frame 0."""
    starts = [first_frame(t) for t in track_list]
    if any(s is None for s in starts):
        return False
    return all(a < b for a, b in zip(starts, starts[1:])) and (not mover_first or starts[0] == 0)


def check_clip(frames_dets: list[list], meta: dict, tol: Tolerances | None = None, size: int = 32
               ) -> dict[str, float]:
    """Every check of one video's per-frame detections (frames of side ``size``) against its metadata: the
    CHECKS (means over objects for per-object checks; NaN = not applicable), "strict" and "partial"."""
    tol = tol or Tolerances()
    objs, skill, n_frames = meta["objects"], meta["skill"], len(frames_dets)
    tr, clean = tracks(frames_dets, [o["color"] for o in objs])
    res: dict[str, list[bool]] = {k: [] for k in CHECKS}
    res["extra"].append(clean)
    for j, (o, t) in enumerate(zip(objs, tr)):
        res["present"].append(check_present(t, o["shape"]))
        res["consistent"].append(check_consistent(t, tol))
        if o.get("bounce"):
            res["bounce"].append(check_bounce(t, o["direction"], tol))
        elif o.get("direction"):
            res["direction"].append(check_direction(t, o["direction"], tol))
        if o.get("speed"):
            res["speed"].append(check_speed(t, o["direction"], o["speed"], n_frames, size))
        if j in STATIC_SKILLS.get(skill, ()):
            res["static"].append(check_static(t, tol))
    if skill in ("pair", "order"):
        res["order"].append(check_order(tr[0], tr[1], n_frames, sequential=skill == "order"))
    if skill in ("appear", "sequence"):
        res["appear"].append(check_appear(tr, mover_first=skill == "appear"))
    flat = [float(v) for vs in res.values() for v in vs]
    out = {k: (sum(v) / len(v) if v else math.nan) for k, v in res.items()}
    out["strict"] = float(all(v == 1.0 for v in flat))
    out["partial"] = sum(flat) / len(flat)
    return out


def detect_video(videos, tau: float | None = None, min_area: int | None = None) -> list[list[list]]:
    """Per video, per frame, the image world's detections of a batch of videos (B, F, 3, H, W) in [0, 1]."""
    from flowrl.data.shapes import detect

    if videos.dim() != 5 or videos.shape[2] != 3:
        raise ValueError(f"moving-shapes videos must be (B, F, 3, H, W), got {tuple(videos.shape)}")
    b, f = videos.shape[:2]
    kw = {k: v for k, v in (("tau", tau), ("min_area", min_area)) if v is not None}
    flat = detect.detect(videos.detach().float().reshape(b * f, *videos.shape[2:]), **kw)
    return [flat[i * f:(i + 1) * f] for i in range(b)]
