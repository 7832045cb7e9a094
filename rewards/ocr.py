"""OCR reward of Flow-GRPO (``flow_grpo/ocr.py``; NaN rule of MARBLE): does the image show the quoted text?

    target t = the text between the first pair of '"' in the prompt (or meta["ocr_text"]),
               spaces removed, lower-cased;  NaN when there is none
    read   o = the engine's recognised lines joined, spaces removed, lower-cased
    d = 0 if t ⊂ o else min(Levenshtein(o, t), |t|);      r = 1 − d / |t|

Engines (optional extras, loaded in ``setup``): ``paddleocr`` (the anchor: PaddleOCR, lang "en", no angle
classifier, CPU), ``rapidocr`` (RapidOCR on onnxruntime, lighter), or ``module:attr`` naming a factory
``(cfg) -> engine`` whose ``engine.read(images: list[np.ndarray HWC uint8]) -> list[str]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rewards.base import RewardInput


def levenshtein(a: str, b: str) -> int:
    """Edit distance (unit-cost insert, delete, substitute), two-row dynamic programme."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def target_text(prompt: str, meta: dict | None = None) -> str | None:
    """meta["ocr_text"] if given, else the first '"'-quoted span of the prompt; None when absent or empty."""
    text = (meta or {}).get("ocr_text")
    if text is None:
        parts = prompt.split('"')
        text = parts[1] if len(parts) >= 3 else None
    text = None if text is None else text.replace(" ", "").lower()
    return text or None


def ocr_score(recognized: str, target: str | None) -> float:
    """r = 1 − min(Lev(o, t), |t|)/|t| with d = 0 when t ⊂ o (Flow-GRPO); NaN when there is no target."""
    if not target:
        return math.nan
    read = recognized.replace(" ", "").lower()
    dist = 0 if target in read else min(levenshtein(read, target), len(target))
    return 1.0 - dist / len(target)


class PaddleEngine:
    """PaddleOCR 2.x (``ocr(img, cls=False)``, the anchor's 2.9.1) or 3.x (``predict``)."""

    def __init__(self, cfg: Config):
        from paddleocr import PaddleOCR

        try:  # 2.x signature, as the anchor
            self.ocr = PaddleOCR(use_angle_cls=False, lang=cfg.lang, use_gpu=False, show_log=False)
            self.v3 = False
        except (TypeError, ValueError):
            self.ocr = PaddleOCR(lang=cfg.lang, use_doc_orientation_classify=False, use_doc_unwarping=False,
                                 use_textline_orientation=False)
            self.v3 = True

    def read(self, images) -> list[str]:
        out = []
        for img in images:
            if self.v3:
                res = self.ocr.predict(img)
                out.append("".join(t for r in res for t in r["rec_texts"]))
            else:
                res = self.ocr.ocr(img, cls=False)[0] or []
                out.append("".join(line[1][0] for line in res if line[1][1] > 0))
        return out


class RapidEngine:
    """RapidOCR (``rapidocr`` ≥2 or ``rapidocr_onnxruntime`` 1.x)."""

    def __init__(self, cfg: Config):
        try:
            from rapidocr import RapidOCR
        except ImportError:
            from rapidocr_onnxruntime import RapidOCR
        self.engine = RapidOCR()

    def read(self, images) -> list[str]:
        out = []
        for img in images:
            res = self.engine(img)
            if isinstance(res, tuple):  # 1.x: (lines | None, elapsed)
                out.append("".join(line[1] for line in (res[0] or [])))
            else:
                out.append("".join(res.txts or ()))
        return out


ENGINES = {"paddleocr": PaddleEngine, "rapidocr": RapidEngine}


@dataclass
class Config:
    engine: str = "paddleocr"   # the anchor's; "rapidocr", or "module:attr" of an engine factory
    lang: str = "en"


class OCR:
    """1 − normalised edit distance between the quoted prompt text and the text read in the image."""

    Config = Config
    name = "ocr"
    accepts = ("image",)

    def __init__(self, cfg: Config | None = None):
        self.cfg = cfg or Config()
        self.engine = None

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        name = self.cfg.engine
        if name in ENGINES:
            try:
                self.engine = ENGINES[name](self.cfg)
            except ImportError as e:
                pkg = {"paddleocr": "paddleocr paddlepaddle", "rapidocr": "rapidocr onnxruntime"}[name]
                raise ImportError(f"OCR engine {name!r} is not installed ({e}); pip install {pkg}") from e
        elif ":" in name:
            from flowrl.registry import import_string

            self.engine = import_string(name)(self.cfg)
        else:
            raise ValueError(f"unknown OCR engine {name!r}; use one of {sorted(ENGINES)} or 'module:attr'")

    def __call__(self, batch: RewardInput) -> Tensor:
        meta = batch.meta or [{}] * len(batch)
        targets = [target_text(p, m) for p, m in zip(batch.prompts, meta)]
        scores = torch.full((len(batch),), math.nan)
        todo = [i for i, t in enumerate(targets) if t]
        if todo:
            arr = (batch.pixels[todo].detach().float().cpu() * 255).round().clamp(0, 255).to(torch.uint8)
            texts = self.engine.read(list(arr.permute(0, 2, 3, 1).numpy()))
            for i, text in zip(todo, texts):
                scores[i] = ocr_score(text, targets[i])
        return scores
