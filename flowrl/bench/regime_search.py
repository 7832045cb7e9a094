"""The regime study's search part: DTS* against best-of-N where best-of-N does not saturate.

The trees benchmark's search (partial credit, 16 samples, 8 steps) leaves best-of-N at 0.99, nothing to find.
Here the reward is the verifier's strict accuracy with partial credit as a tie-break (``strict + w·partial``:
all-or-nothing, but graded below 1 so a greedy search can climb), on the hardest held-out skills (``--skills``,
default relations and counting), with few samples (``--search-samples`` best-of-N rollouts of ``--search-steps``
ODE steps). DTS* (``samplers.search.dts_star``: greedy selection, max backup, ``--search-kernel`` expansions —
default CPS at η 0.7, whose coefficient-preserving steps keep the SDE samples as clean as the ODE's at 20 steps;
flow_sde's added noise costs DTS* most of its advantage — the last step ODE) runs at ``--search-fractions`` of
best-of-N's NFEs from the same root noises. Per search seed (``--search-seeds``; search seed s of prompt p is
``1000·s + p``; the regime was chosen on seed 0, so the defaults 1–3 are fresh noises) the mean over the
prompts; the headline curve is the mean over search seeds ± SE.

``dts_nfe_to_bestofn`` = the NFEs at which DTS*'s mean reward curve first reaches best-of-N's mean ÷
best-of-N's NFEs (target ≤ 0.5; null when never reached). Also the strict accuracy alone of each returned
sample, and the wall seconds of each method (one thread, beside whatever else runs on the machine).
"""
from __future__ import annotations

import statistics
import time

from flowrl.bench import learning_lib


def add_args(ap) -> None:
    g = ap.add_argument_group("search")
    g.add_argument("--search-steps", type=int, default=20)
    g.add_argument("--search-samples", type=int, default=4, help="best-of-N's N")
    g.add_argument("--search-skills", default="relation,counting")
    g.add_argument("--search-prompts", type=int, default=16)
    g.add_argument("--search-partial-weight", type=float, default=0.5, help="w of strict + w·partial")
    g.add_argument("--search-kernel", default="cps")
    g.add_argument("--search-noise", type=float, default=0.7, help="the expansion kernel's noise_level")
    g.add_argument("--search-fractions", default="0.25,0.375,0.5,0.75,1.0")
    g.add_argument("--search-seeds", default="1,2,3", help="search seeds (the regime was chosen on seed 0)")


def hard_prompts(skills: list[str], n: int) -> list:
    """The first ``n`` held-out (prompt, metadata) pairs whose skill is one of ``skills``."""
    from flowrl.data.prompts import load_prompts

    items = [it for it in load_prompts("shapes:heldout", 0).fixed(10_000) if it[1]["skill"] in skills]
    if not items:
        raise ValueError(f"regime search: no held-out prompt has a skill in {skills}")
    return items[:n]


def scorer(policy, prompt: str, meta: dict, partial_weight: float):
    """latents (B, ...) → (B,) strict + w·partial of the decoded images, and the strict part alone."""
    import torch

    from rewards import RewardSet
    from rewards.base import make_input

    rs = RewardSet({"strict": {"reward": "shapes", "weight": 1.0, "kwargs": {"mode": "strict"}},
                    "partial": {"reward": "shapes", "weight": partial_weight}})

    def score(latents):
        pix = policy.decode(latents).float().clamp(0, 1)
        n = pix.shape[0]
        out = rs(make_input(pix, [prompt] * n, torch.zeros(n, dtype=torch.long), [dict(meta)] * n))
        return torch.nan_to_num(out.total, nan=float("-inf"))

    def strict(latents) -> float:
        pix = policy.decode(latents).float().clamp(0, 1)
        out = rs(make_input(pix, [prompt], torch.zeros(1, dtype=torch.long), [dict(meta)]))
        return float(out.scores[0, out.names.index("strict")])

    return score, strict


def one_seed(policy, items, args, seed: int, fracs: list[float]) -> dict:
    """Best-of-N and DTS* at each budget fraction on every prompt for one search seed: prompt means."""
    import torch

    from samplers import KERNELS
    from samplers import search as S
    from samplers.engine import SampleSpec, SamplingEngine

    steps, n = args.search_steps, args.search_samples
    kern = KERNELS.get(args.search_kernel)
    kcfg = kern.Config(noise_level=args.search_noise)
    eng = SamplingEngine(policy, SampleSpec(steps, 32, 32))
    sig = eng.sigmas(eng.noise([torch.Generator()]))
    rows = {"bon": [], **{f: [] for f in fracs}}
    secs = {"bon": 0.0, **{f: 0.0 for f in fracs}}
    for p, (prompt, meta) in enumerate(items):
        cond = eng.encode([prompt])

        def velocity(x, sigma, cond=cond):
            return policy.velocity(x, sigma, cond.select([0] * x.shape[0]), 1.0)

        score, strict = scorer(policy, prompt, meta, args.search_partial_weight)
        with torch.no_grad():
            t0 = time.perf_counter()
            r = S.best_of_n(velocity, eng.noise, sig, score, n * steps, seed=1000 * seed + p)
            secs["bon"] += time.perf_counter() - t0
            rows["bon"].append((r.nfe, r.reward, strict(r.latents)))
            for f in fracs:
                t0 = time.perf_counter()
                d = S.dts_star(velocity, eng.noise, sig, score, max(steps, int(n * steps * f)),
                               seed=1000 * seed + p, kernel=kern, kernel_cfg=kcfg)
                secs[f] += time.perf_counter() - t0
                rows[f].append((d.nfe, d.reward, strict(d.latents)))
    mean = {k: tuple(statistics.fmean(col) for col in zip(*v)) for k, v in rows.items()}
    return {k: {"nfe": m[0], "reward": m[1], "strict": m[2], "wall_s": secs[k]} for k, m in mean.items()}


def search(args) -> dict:
    import torch

    from flowrl.policies.toy import ToyPolicy

    torch.set_num_threads(1)
    fracs = [float(f) for f in args.search_fractions.split(",")]
    skills = [s.strip() for s in args.search_skills.split(",")]
    policy = ToyPolicy.from_pretrained(dtype=torch.float32)
    items = hard_prompts(skills, args.search_prompts)
    seeds = [int(s) for s in args.search_seeds.split(",")][:1 if args.quick else None]
    per_seed = [one_seed(policy, items, args, s, fracs) for s in seeds]

    def summary(key) -> dict:
        out = {}
        for m in ("nfe", "reward", "strict", "wall_s"):
            mu, se = learning_lib.mean_se([r[key][m] for r in per_seed])
            out[m], out[f"{m}_se"] = mu, se
        return out

    bon = summary("bon")
    dts = [{"budget_fraction": f, **summary(f)} for f in fracs]
    reach = learning_lib.nfe_to_reach([(d["nfe"], d["reward"]) for d in dts], bon["reward"])
    return {"search": {"best_of_n": bon, "dts_star": dts, "steps": args.search_steps,
                       "samples": args.search_samples, "skills": skills, "prompts": len(items),
                       "reward": f"strict + {args.search_partial_weight}·partial",
                       "kernel": {"kind": args.search_kernel, "noise_level": args.search_noise},
                       "seeds": seeds},
            "dts_nfe_to_bestofn": reach / bon["nfe"] if reach is not None else None}
