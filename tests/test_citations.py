"""Docstrings, comments and docs cite public sources (paper + arXiv id, or the anchor's repository and file), never
the internal reference documents ("reference A–I §x", which are not in the repository and mean nothing to a reader).

Scanned: every ``.py`` under ``flowrl/``, ``samplers/``, ``rewards/``, ``scripts/``; ``docs/*.md``, ``README.md``;
and the comment headers of ``configs/**/*.yaml``.
"""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INTERNAL = [
    re.compile(r"[Rr]ef(erence|\.)? ?[A-I]\b ?§|[Rr]eference [A-I]\b"),  # "reference F §A.3", "ref. C §5"
    re.compile(r"(?<![\w.§])[A-I] §\d"),                                # the letter alone: "..., B §4.3", "(F §C.3)"
    re.compile(r"\breference/[A-I]_\w+\.md"),                           # a path to one of the documents
]


def scanned_files() -> list[Path]:
    files = [p for d in ("flowrl", "samplers", "rewards", "scripts") for p in sorted((REPO / d).rglob("*.py"))]
    files += sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"] + sorted((REPO / "configs").rglob("*.yaml"))
    return [p for p in files if p.is_file()]


def internal_citations(path: Path) -> list[str]:
    hits = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for pattern in INTERNAL:
            match = pattern.search(line)
            if match:
                hits.append(f"{path.relative_to(REPO)}:{number}: {match.group(0)!r} in {line.strip()[:100]!r}")
                break
    return hits


def test_patterns_catch_the_internal_forms_and_spare_public_ones():
    internal = ["(reference A §2.1)", "ref. C §5", "Reference D §1.5–1.6 (Self-Forcing", "(reference E §3.7 rule 5)",
                "(docs/distill.md, reference D)", "refA §1.2", "reference C §1, F §A.2", "(B §4.3)",
                "`reference/D_streaming_video_dmd.md`"]
    public = ["(Flow-GRPO, arXiv 2505.05470, Eq. 9)", "(flow_grpo ``sd3_sde_with_logprob.py``)", "SD3 §3.1",
              "(Esser et al. 2024, §5.3.2)", "the parity reference", "reference rewards", "Self-Forcing §3"]
    assert all(any(p.search(s) for p in INTERNAL) for s in internal)
    assert not any(p.search(s) for p in INTERNAL for s in public)


def test_no_internal_reference_letter_citations():
    files = scanned_files()
    assert len(files) > 100
    hits = [hit for path in files for hit in internal_citations(path)]
    assert not hits, ("cite the paper (arXiv id, section/equation) or the anchor's repository and file instead of the "
                      "internal reference documents:\n" + "\n".join(hits))
