"""The hacking benchmark's figures: the gain-vs-palette scatter with the KL-β front, palette-distance curves, and the
before / after gallery.

    front_summary(results, "grpo", sweep_betas, guards)   # → plot_reward_space input
    side_by_side(gallery_columns(raw, "grpo", "normguard"), "hacking_grpo_gallery.png", rows=4, cols=3)

The scatter puts each method at its seed-mean (palette ratio, held-out strict gain) with ± 1 standard error over
seeds on both axes; the KL-β sweep (β = 0 is the unguarded run) is grey and labelled "beta=…", the guards coloured and
named, the base checkpoint a black cross at (1, 0).
"""
from __future__ import annotations

from pathlib import Path

from flowrl.bench.paths import rel
from flowrl.eval.before_after import side_by_side

AXES = ("palette ratio", "strict gain")


def front_summary(results: dict, base: str, betas: dict[str, float], guards: list[str]) -> dict:
    """``plot_reward_space``'s input for one base: the sweep methods ``betas`` ({method: β}) and the ``guards``
    of ``results`` ({"<base>/<method>": summarize(...)}), x = palette ratio, y = strict gain."""
    methods = {}
    for name in [*betas, *guards]:
        r = results.get(f"{base}/{name}")
        if r is None:
            continue
        entry = {"point": [r["palette_ratio_mean"], r["gain_mean"]],
                 "gain": {AXES[0]: {"ci95": r["palette_ratio_se"]}, AXES[1]: {"ci95": r["gain_se"]}}}
        if name in betas:
            entry.update(weights=[betas[name]], label=f"beta={betas[name]:g}")  # ASCII, as the figures and JSON name it
        methods[name] = entry
    return {"rewards": list(AXES), "base": [1.0, 0.0], "methods": methods}


def gallery_columns(raw: dict, base: str, guard: str | None,
                    measured: set[str] = frozenset()) -> list[tuple[str, Path]]:
    """(title, first grid page) of seed 0 for one base: the base model, then its unguarded, KL and ``guard``
    runs after training. Empty when one of them is in ``measured`` ("base/method" with results) but not in
    ``raw`` (carried from an earlier session), or a grid is not on disk: an incomplete gallery is not drawn, so
    the earlier file's complete one is kept (``hacking_carry.keep_plots``)."""
    first = {k: v[0] for k, v in raw.items() if k.startswith(f"{base}/")}
    own_before = [r for r in first.values() if not r.get("before_cached")]
    columns = [("base model (before)", Path(own_before[0]["run_dir"]) / "eval/before/grid_000.png")] \
        if own_before else []
    for method, title in (("none", "unguarded"), ("kl", "recipe KL"), (guard, "best guard")):
        run = first.get(f"{base}/{method}")
        if run is None and f"{base}/{method}" in measured:
            return []
        if run is not None:
            columns.append((f"{base} {title}: {method}", Path(run["run_dir"]) / "eval/after/grid_000.png"))
    return columns if all(p.is_file() for _, p in columns) else []


def draw(lib, where: Path, results: dict, raw: dict, fronts: dict, guards: dict, best: dict, cols: int) -> dict:
    """Per base (``fronts``: {base: {sweep method: β}}, ``guards``: {base: [guard]}, ``best``: {base: its best
    guard}) the gain-vs-palette scatter, the palette curves of the methods whose summary holds one (drawn only when
    the unguarded run's does: its curve is the reference line), and the gallery from ``raw``'s evaluation grids.
    Returns {name: path}, or {name_error: repr} for a figure that failed (the figures are a convenience)."""
    out = {}
    for base, betas in fronts.items():
        try:
            if len(betas) > 1 or (betas and guards[base]):          # a front of one point says nothing
                out[f"{base}_front"] = rel(lib.plot_reward_space(front_summary(results, base, betas, guards[base]),
                                                                 where / f"hacking_{base}_front.png"))
            curves = {m: results[f"{base}/{m}"] for m in ["none", "kl", *guards[base]]
                      if "curve" in results.get(f"{base}/{m}", {})}
            if "none" in curves:                    # without the unguarded curve a plot has no reference line
                out[f"{base}_palette"] = rel(lib.plot_curves(curves, where / f"hacking_{base}_palette.png",
                                                             metric="palette", x="iteration"))
            columns = gallery_columns(raw, base, best.get(base) and best[base].split("/")[1], set(results))
            if columns:
                out[f"{base}_gallery"] = rel(side_by_side(columns, where / f"hacking_{base}_gallery.png", cols=cols))
        except Exception as e:
            out[f"{base}_error"] = repr(e)
    return out
