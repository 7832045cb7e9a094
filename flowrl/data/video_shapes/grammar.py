"""Prompt grammar of the moving-shapes world: seven skills stating motion and timing, each prompt paired with
metadata ``{"skill", "objects": [{"color", "shape", "direction", "speed", "bounce"}]}``.

    motion    "a red circle moving right"                        one object, direction (left/right/rising/falling)
    speed     "a red circle falling quickly"                     … at a stated speed (slowly / quickly)
    bounce    "a red circle moving right and bouncing back"      moves, then reverses
    pair      "a red circle moving right and a blue square rising"   two objects moving at the same time
    order     "a red circle moves right, then a blue square falls"   the first moves, then the second
    appear    "a red circle falls, then a blue square appears"       the first moves, the second appears later
    sequence  "a red circle, then a blue square, then a green triangle appear"   three still objects, in order

Objects of one prompt have different colours (and, with several objects, different shapes). ``phrase(meta)``
writes the prompt, ``parse(prompt)`` reads it back (``parse(phrase(m)) == m``), ``all_prompts()`` enumerates
the grammar in a fixed order.
"""
from __future__ import annotations

import re
from itertools import permutations

from flowrl.data.video_shapes.world import COLORS, DIRECTIONS, PARTICIPLE, SHAPES, SKILLS, SPEED_ADVERB, SPEEDS, VERB


def make_obj(color: str, shape: str, direction: str | None = None, speed: str | None = None,
             bounce: bool = False) -> dict:
    """One object spec of the metadata."""
    return {"color": color, "shape": shape, "direction": direction, "speed": speed, "bounce": bounce}


def make_meta(skill: str, objects: list[dict]) -> dict:
    """Metadata dict of a skill and its object specs (see ``make_obj``)."""
    if skill not in SKILLS:
        raise ValueError(f"unknown moving-shapes skill {skill!r}; expected one of {SKILLS}")
    return {"skill": skill, "objects": objects}


def _np(o: dict) -> str:
    return f"a {o['color']} {o['shape']}"


def phrase(meta: dict) -> str:
    """The prompt string for metadata ``meta``."""
    s, o = meta["skill"], meta["objects"]
    if s == "motion":
        return f"{_np(o[0])} {PARTICIPLE[o[0]['direction']]}"
    if s == "speed":
        return f"{_np(o[0])} {PARTICIPLE[o[0]['direction']]} {SPEED_ADVERB[o[0]['speed']]}"
    if s == "bounce":
        return f"{_np(o[0])} {PARTICIPLE[o[0]['direction']]} and bouncing back"
    if s == "pair":
        return f"{_np(o[0])} {PARTICIPLE[o[0]['direction']]} and {_np(o[1])} {PARTICIPLE[o[1]['direction']]}"
    if s == "order":
        return f"{_np(o[0])} {VERB[o[0]['direction']]}, then {_np(o[1])} {VERB[o[1]['direction']]}"
    if s == "appear":
        return f"{_np(o[0])} {VERB[o[0]['direction']]}, then {_np(o[1])} appears"
    if s == "sequence":
        return f"{_np(o[0])}, then {_np(o[1])}, then {_np(o[2])} appear"
    raise ValueError(f"unknown moving-shapes skill {s!r}; expected one of {SKILLS}")


def _alt(words) -> str:
    return "|".join(sorted(words, key=len, reverse=True))


_NP = rf"a ({_alt(COLORS)}) ({_alt(SHAPES)})"
_PART_OF = {p: d for d, p in PARTICIPLE.items()}
_VERB_OF = {v: d for d, v in VERB.items()}
_SPEED_OF = {a: s for s, a in SPEED_ADVERB.items()}
_P, _V = f"({_alt(_PART_OF)})", f"({_alt(_VERB_OF)})"
_PATTERNS = [
    ("speed", re.compile(rf"^{_NP} {_P} ({_alt(_SPEED_OF)})$")),
    ("bounce", re.compile(rf"^{_NP} {_P} and bouncing back$")),
    ("pair", re.compile(rf"^{_NP} {_P} and {_NP} {_P}$")),
    ("motion", re.compile(rf"^{_NP} {_P}$")),
    ("appear", re.compile(rf"^{_NP} {_V}, then {_NP} appears$")),
    ("order", re.compile(rf"^{_NP} {_V}, then {_NP} {_V}$")),
    ("sequence", re.compile(rf"^{_NP}, then {_NP}, then {_NP} appear$")),
]


def parse(prompt: str) -> dict:
    """Metadata of a grammar prompt (inverse of ``phrase``); raises ValueError naming the prompt otherwise."""
    text = " ".join(prompt.lower().strip().rstrip(".").split())
    for skill, pat in _PATTERNS:
        m = pat.match(text)
        if m is None:
            continue
        g = m.groups()
        if skill == "motion":
            objs = [make_obj(g[0], g[1], _PART_OF[g[2]])]
        elif skill == "speed":
            objs = [make_obj(g[0], g[1], _PART_OF[g[2]], _SPEED_OF[g[3]])]
        elif skill == "bounce":
            objs = [make_obj(g[0], g[1], _PART_OF[g[2]], bounce=True)]
        elif skill == "pair":
            objs = [make_obj(g[0], g[1], _PART_OF[g[2]]), make_obj(g[3], g[4], _PART_OF[g[5]])]
        elif skill == "order":
            objs = [make_obj(g[0], g[1], _VERB_OF[g[2]]), make_obj(g[3], g[4], _VERB_OF[g[5]])]
        elif skill == "appear":
            objs = [make_obj(g[0], g[1], _VERB_OF[g[2]]), make_obj(g[3], g[4])]
        else:
            objs = [make_obj(g[0], g[1]), make_obj(g[2], g[3]), make_obj(g[4], g[5])]
        return make_meta(skill, objs)
    raise ValueError(f"prompt {prompt!r} is not in the moving-shapes grammar (see "
                     "flowrl/data/video_shapes/grammar.py); pass its metadata in RewardInput.meta instead")


def _distinct(k: int) -> list[list[tuple[str, str]]]:
    """Ordered k-tuples of (colour, shape) with pairwise different colours and different shapes."""
    return [list(zip(cs, ss)) for cs in permutations(COLORS, k) for ss in permutations(SHAPES, k)]


def all_prompts() -> dict[str, list[dict]]:
    """Every metadata of the grammar per skill, in a fixed order
    (60 motion, 120 speed, 60 bounce, 1920 pair, 1920 order, 480 appear, 360 sequence)."""
    singles = [(c, s) for c in COLORS for s in SHAPES]
    pairs = _distinct(2)
    dd = [(d1, d2) for d1 in DIRECTIONS for d2 in DIRECTIONS]
    return {
        "motion": [make_meta("motion", [make_obj(c, s, d)]) for d in DIRECTIONS for c, s in singles],
        "speed": [make_meta("speed", [make_obj(c, s, d, v)]) for v in SPEEDS for d in DIRECTIONS
                  for c, s in singles],
        "bounce": [make_meta("bounce", [make_obj(c, s, d, bounce=True)]) for d in DIRECTIONS for c, s in singles],
        "pair": [make_meta("pair", [make_obj(*a, d1), make_obj(*b, d2)]) for d1, d2 in dd for a, b in pairs],
        "order": [make_meta("order", [make_obj(*a, d1), make_obj(*b, d2)]) for d1, d2 in dd for a, b in pairs],
        "appear": [make_meta("appear", [make_obj(*a, d), make_obj(*b)]) for d in DIRECTIONS for a, b in pairs],
        "sequence": [make_meta("sequence", [make_obj(*o) for o in t]) for t in _distinct(3)],
    }


def vocabulary() -> list[str]:
    """Every word the grammar can produce (commas split off), sorted: the video toy tokenizer's vocabulary."""
    words = {w for metas in all_prompts().values() for m in metas for w in re.findall(r"\w+|,", phrase(m))}
    return sorted(words)
