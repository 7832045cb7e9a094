"""Prompt grammar of the shapes world: five skills, each prompt paired with structured metadata.

Skills and templates (metadata ``{"skill", "objects": [{"color", "shape", "count"}], "position", "relation"}``):

    color     "a blue square"                         one object
    counting  "three red circles"                     count ∈ {2, 3, 4}
    position  "a green triangle on the left"          left/right = column halves, top/bottom = row halves
    binding   "a red circle and a blue square"        two objects, different colours and shapes
    relation  "a yellow square above a purple circle" above / below / to the left of / to the right of;
                                                      objects[0] stands in that relation to objects[1]

``phrase(meta)`` writes the prompt, ``parse(prompt)`` reads it back (``parse(phrase(m)) == m``), and
``all_prompts()`` enumerates the grammar in a fixed order.
"""
from __future__ import annotations

import re

from flowrl.data.shapes.world import (
    COLORS,
    COUNT_WORDS,
    POSITION_PHRASES,
    POSITIONS,
    RELATION_PHRASES,
    RELATIONS,
    SHAPE_PLURALS,
    SHAPES,
    SKILLS,
)


def make_meta(skill: str, objects: list[tuple[str, str, int]], position: str | None = None,
              relation: str | None = None) -> dict:
    """Metadata dict from (colour, shape, count) triples."""
    return {"skill": skill, "objects": [{"color": c, "shape": s, "count": n} for c, s, n in objects],
            "position": position, "relation": relation}


def _noun_phrase(obj: dict) -> str:
    noun = obj["shape"] if obj["count"] == 1 else SHAPE_PLURALS[obj["shape"]]
    return f"{COUNT_WORDS[obj['count']]} {obj['color']} {noun}"


def phrase(meta: dict) -> str:
    """The prompt string for metadata ``meta``."""
    objs = meta["objects"]
    head = _noun_phrase(objs[0])
    if meta["skill"] in ("color", "counting"):
        return head
    if meta["skill"] == "position":
        return f"{head} {POSITION_PHRASES[meta['position']]}"
    if meta["skill"] == "binding":
        return f"{head} and {_noun_phrase(objs[1])}"
    if meta["skill"] == "relation":
        return f"{head} {RELATION_PHRASES[meta['relation']]} {_noun_phrase(objs[1])}"
    raise ValueError(f"unknown skill {meta['skill']!r}; expected one of {SKILLS}")


_COUNT_OF = {w: n for n, w in COUNT_WORDS.items()}
_SHAPE_OF = {**{s: s for s in SHAPES}, **{p: s for s, p in SHAPE_PLURALS.items()}}
_NP = (rf"({'|'.join(_COUNT_OF)}) ({'|'.join(COLORS)}) "
       rf"({'|'.join(sorted(_SHAPE_OF, key=len, reverse=True))})")
_POS_OF = {p: k for k, p in POSITION_PHRASES.items()}
_REL_OF = {p: k for k, p in RELATION_PHRASES.items()}
_PATTERNS = [
    ("position", re.compile(rf"^{_NP} ({'|'.join(_POS_OF)})$")),
    ("binding", re.compile(rf"^{_NP} and {_NP}$")),
    ("relation", re.compile(rf"^{_NP} ({'|'.join(sorted(_REL_OF, key=len, reverse=True))}) {_NP}$")),
    ("single", re.compile(rf"^{_NP}$")),
]


def _obj(count: str, color: str, shape: str) -> tuple[str, str, int]:
    return color, _SHAPE_OF[shape], _COUNT_OF[count]


def parse(prompt: str) -> dict:
    """Metadata of a grammar prompt (inverse of ``phrase``); raises ValueError naming the prompt otherwise."""
    text = " ".join(prompt.lower().strip().rstrip(".").split())
    for kind, pat in _PATTERNS:
        m = pat.match(text)
        if m is None:
            continue
        g = m.groups()
        if kind == "single":
            obj = _obj(*g)
            return make_meta("color" if obj[2] == 1 else "counting", [obj])
        if kind == "position":
            return make_meta("position", [_obj(*g[:3])], position=_POS_OF[g[3]])
        if kind == "binding":
            return make_meta("binding", [_obj(*g[:3]), _obj(*g[3:])])
        return make_meta("relation", [_obj(*g[:3]), _obj(*g[4:])], relation=_REL_OF[g[3]])
    raise ValueError(f"prompt {prompt!r} is not in the shapes grammar (see flowrl/data/shapes/grammar.py); "
                     "pass its metadata in RewardInput.meta instead")


def all_prompts() -> dict[str, list[dict]]:
    """Every metadata of the grammar per skill, in a fixed order (15 + 45 + 60 + 120 + 720 prompts)."""
    pairs = [(c, s) for c in COLORS for s in SHAPES]
    out = {
        "color": [make_meta("color", [(c, s, 1)]) for c, s in pairs],
        "counting": [make_meta("counting", [(c, s, n)]) for n in (2, 3, 4) for c, s in pairs],
        "position": [make_meta("position", [(c, s, 1)], position=p) for p in POSITIONS for c, s in pairs],
        "binding": [make_meta("binding", [(c1, s1, 1), (c2, s2, 1)])
                    for c1, s1 in pairs for c2, s2 in pairs if c1 != c2 and s1 != s2],
        "relation": [make_meta("relation", [(c1, s1, 1), (c2, s2, 1)], relation=r)
                     for r in RELATIONS for c1, s1 in pairs for c2, s2 in pairs if c1 != c2],
    }
    return out


def vocabulary() -> list[str]:
    """Every word the grammar can produce, sorted (the toy tokenizer's vocabulary)."""
    words = {w for metas in all_prompts().values() for m in metas for w in phrase(m).split()}
    return sorted(words)
