"""``index.html``: a static gallery linking the grid files with their captions, a score table, and the drift
alarms of the evaluation (one red line each) when it was compared with a base.

No JavaScript, no external assets; every string is HTML-escaped. Links are relative, so an eval directory
can be copied or served as is (``python -m http.server -d runs/<name>/eval``).
"""
from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["GalleryEntry", "render_gallery", "write_gallery"]

_STYLE = ("body{font-family:sans-serif;margin:1.5em}img,video{max-width:100%;border:1px solid #ccc}"
          "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;"
          "text-align:right}th{background:#f3f3f3}figcaption{font-size:90%;color:#333}figure{margin:1em 0}"
          ".alarm{background:#fde8e8;border:2px solid #c00;color:#900;padding:4px 8px;font-weight:bold}"
          ".no-alarm{color:#060}")


@dataclass
class GalleryEntry:
    """One grid file (relative path) with a title and per-row captions (the prompts)."""

    file: str
    title: str
    rows: Sequence[str] = field(default_factory=list)
    columns: Sequence[str] = field(default_factory=list)
    first_row: int = 1  # number of the first row (pages of a long prompt list continue the count)


def _media(file: str) -> str:
    src = html.escape(file, quote=True)
    if file.lower().endswith(".mp4"):
        return f'<video src="{src}" controls loop muted autoplay></video>'
    return f'<a href="{src}"><img src="{src}" alt="{src}"></a>'


def _score_table(summary: Mapping[str, Mapping[str, float]]) -> str:
    """``summary[policy][score name] = mean`` as a table, policies as rows."""
    if not summary:
        return ""
    names = sorted({n for scores in summary.values() for n in scores})
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    body = []
    for policy, scores in summary.items():
        cells = "".join(f"<td>{_fmt(scores.get(n))}</td>" for n in names)
        body.append(f"<tr><th>{html.escape(policy)}</th>{cells}</tr>")
    return f"<table><tr><th>policy \\ mean</th>{head}</tr>{''.join(body)}</table>"


def _fmt(v) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.4g}"


def _alarm_lines(alarms: Sequence[str] | None) -> list[str]:
    """One red line per drift alarm; a green "none" line when compared and in band; nothing without a base."""
    if alarms is None:
        return []
    if not alarms:
        return ["<p class='no-alarm'>Drift alarms: none (every hacking statistic within its band)</p>"]
    return [f"<p class='alarm'>&#9888; DRIFT ALARM: {html.escape(a)}</p>" for a in alarms]


def render_gallery(title: str, entries: Sequence[GalleryEntry],
                   summary: Mapping[str, Mapping[str, float]] | None = None, notes: Sequence[str] = (),
                   alarms: Sequence[str] | None = None) -> str:
    """The gallery page as a string; ``alarms``: drift-alarm lines shown under the title (None: no base
    reference, no alarm section; empty: compared, none fired)."""
    parts = [(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
              f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>")]
    parts += _alarm_lines(alarms)
    parts += [f"<p>{html.escape(n)}</p>" for n in notes]
    parts.append(_score_table(summary or {}))
    for e in entries:
        rows = "".join(f"<li>{html.escape(r)}</li>" for r in e.rows)
        cols = f"<p>columns: {html.escape(' | '.join(e.columns))}</p>" if e.columns else ""
        parts.append(f"<figure><h2>{html.escape(e.title)}</h2>{_media(e.file)}<figcaption>{cols}"
                     f"<ol start='{int(e.first_row)}'>{rows}</ol></figcaption></figure>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_gallery(out_dir: str | Path, title: str, entries: Sequence[GalleryEntry],
                  summary: Mapping[str, Mapping[str, float]] | None = None, notes: Sequence[str] = (),
                  alarms: Sequence[str] | None = None) -> Path:
    """Write ``out_dir/index.html``; entry files must be relative to ``out_dir``."""
    path = Path(out_dir) / "index.html"
    path.write_text(render_gallery(title, entries, summary, notes, alarms))
    return path
