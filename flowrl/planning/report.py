"""The planner's table and verdict as text (``scripts/plan.py``)."""
from __future__ import annotations

from flowrl.planning.budget import HEADROOM_GIB, GiB, Plan


def gib(x: float) -> str:
    return f"{x / GiB:9.3f}"


def table(p: Plan) -> str:
    """Items, phases, peak and verdict, one line each (GiB per process)."""
    lines = [f"{p.model} on {p.gpus} process(es) of {p.gpu_mem_gib:g} GiB"
             f"{', FSDP-sharded' if p.sharded else ''}: GiB per process", "-" * 60]
    lines += [f"{gib(v)}  {k}" for k, v in p.items.items()]
    lines += [f"{gib(v)}  {k} (estimate)" if "activations" in k else f"{gib(v)}  {k}"
              for k, v in p.phases.items() if v]
    lines += ["-" * 60, f"{gib(p.peak)}  predicted peak (resident + the larger activation phase"
              f"{' + gathered units' if p.sharded else ''})"]
    return "\n".join(lines)


def verdict(p: Plan) -> str:
    """Fits / does not fit, and the predicted effect of each single change."""
    usable = p.gpu_mem_gib - HEADROOM_GIB
    head = (f"FITS: {p.peak / GiB:.2f} GiB of {usable:g} usable ({HEADROOM_GIB:g} GiB kept for the CUDA context)"
            if p.fits else f"DOES NOT FIT: {p.peak / GiB:.2f} GiB > {usable:g} usable "
            f"({HEADROOM_GIB:g} GiB kept for the CUDA context)")
    lines = [head]
    if p.remedies:
        lines.append("predicted effect of one change each:")
        for r in p.remedies:
            if "error" in r:
                lines.append(f"  {r['change']:40s} not possible: {r['error']}")
            else:
                lines.append(f"  {r['change']:40s} peak {r['peak_gib']:8.2f} GiB ({'fits' if r['fits'] else 'no'})")
        if not p.fits:
            first = next((r for r in p.remedies if r.get("fits")), None)
            lines.append(f"change first: {first['change']}" if first else
                         "no single change fits: combine them (FSDP over more GPUs, checkpointing, micro_batch 1)")
    return "\n".join(lines)
