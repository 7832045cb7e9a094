"""Carry a previous ``hacking.json``'s finished methods into this run, so one benchmark can be assembled across
sessions (each fits part of it on two cores) after the finished-run cache of the earlier one is gone.

    carried = load(Path("docs/benchmarks/hacking.json"), args, code_digest())   # {"nft/none": summary, ...}

A method is carried only when the previous run measured it under the same conditions: the same source code (the
digest ``learning_lib.code_digest``; a file written before the digest was recorded is taken as ``unrecorded``,
and ``provenance`` says so), the same training and evaluation seeds and prompts, and its base's budget
(iterations, eval every) equal to this run's. A method run or cached now always wins over a carried one.
"""
from __future__ import annotations

import json
from pathlib import Path

from flowrl.bench.paths import rel, resolve

MATCH = ("seeds", "eval_seeds", "eval_prompts")        # run-wide settings a carried method must share
PER_BASE = ("iterations", "eval_every")                 # per-base budget settings it must share


def read(path: Path | None) -> dict:
    """The previous JSON (``{}`` when no path is given)."""
    if path is None:
        return {}
    if not path.is_file():
        raise ValueError(f"--carry: no file {path}")
    return json.loads(path.read_text())


def check_code(prev: dict, code: str, path: Path) -> str:
    """The previous run's code digest, or ``unrecorded``; a different recorded digest is refused in one line."""
    theirs = prev.get("code")
    if theirs is not None and theirs != code:
        raise ValueError(f"--carry {path}: measured with source digest {theirs}, this code is {code}; "
                         "its runs are not this code's (rerun them instead)")
    return theirs or "unrecorded"


def same_conditions(prev: dict, args, base: str) -> bool:
    """Whether ``prev`` measured ``base`` with this run's seeds, evaluation and budget."""
    mine = {"seeds": args.seeds, "eval_seeds": args.eval_seeds, "eval_prompts": args.eval_prompts or "all"}
    if any(prev.get(k) != mine[k] for k in MATCH):
        return False
    return all((prev.get(k) or {}).get(base) == getattr(args, k)[base] for k in PER_BASE)


def load(path: Path | None, args, code: str) -> tuple[dict, dict]:
    """({"<base>/<method>": summary} carried from ``path``, provenance {"from", "code", "machine", "methods"});
    (``{}``, ``{}``) without a path."""
    prev = read(path)
    if not prev:
        return {}, {}
    digest = check_code(prev, code, path)
    methods = {k: v for k, v in prev.get("methods", {}).items() if same_conditions(prev, args, k.split("/")[0])}
    return methods, {"from": rel(path), "code": digest, "machine": prev.get("machine", "unrecorded"),
                     "methods": sorted(methods), "prev": prev}


def carry_dppo(provenance: dict, args) -> dict | None:
    """The previous ``dppo_vs_grpo`` block when it ran at this run's DPPO budget and seeds (else None)."""
    prev = provenance.get("prev", {})
    block = prev.get("dppo_vs_grpo")
    if not block or "skipped" in block or block.get("iterations") != args.dppo_iterations:
        return None
    if prev.get("seeds") != args.seeds or prev.get("eval_seeds") != args.eval_seeds:
        return None
    return {**block, "carried_from": provenance["from"]}


def keep_plots(provenance: dict, made: dict) -> dict:
    """This run's plots, plus the previous run's ``<base>_<figure>`` of a base with carried methods where this run
    could not draw that figure (no curves or evaluation grids here for a carried method) and its file is there."""
    prev = provenance.get("prev", {}).get("plots", {})
    bases = {m.split("/")[0] for m in provenance.get("methods", [])}
    kept = {k: v for k, v in prev.items() if k.split("_")[0] in bases and k not in made
            and not k.endswith("error") and resolve(v).is_file()}
    return {**made, **kept}


def public(provenance: dict) -> dict:
    """The provenance as the JSON records it (without the previous file's body)."""
    return {k: v for k, v in provenance.items() if k != "prev"}
