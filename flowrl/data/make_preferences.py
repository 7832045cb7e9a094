"""Build a preference (or demonstration) dataset from any recipe's model, sampler and rewards.

    records = make_preferences("configs/toy/nft.yaml", out="data/prefs", prompts=480, candidates=4)

The recipe's own rollout stage samples ``candidates`` images per prompt from its training prompts (``run.seed``
chooses them and the noise; the "old" weights: the base, or a trainer checkpoint's "train" weights with
``checkpoint``), its reward set scores them, and each prompt gives one record: the best image by the weighted
total as ``chosen`` and the worst as ``rejected`` (``pairs="best_worst"``, verl-omni ``prepare_offline_dpo.py``:
sort the candidates, first = win, last = lose), or every strictly ordered pair of its candidates
(``pairs="all_pairs"``, the online rule of ``flowrl.objectives.pairs``). Tied pairs are left out (``keep_ties``
keeps best_worst's), and so are prompts left without a pair. Each record's ``nfe`` is its share of the velocity
evaluations its prompt's candidates cost (a left-out prompt's are spread over the kept records), so the
dataset's NFEs sum to what making it cost. A recipe whose objective is offline samples as its online form
(``objective.data`` null). Images are PNGs beside
``preferences.jsonl`` (format: ``flowrl.data.preferences``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from flowrl.data.preferences import save_image, write_manifest


def make_preferences(recipe: str | Path, out: str | Path, *, prompts: int, candidates: int = 4, seed: int = 1000,
                     checkpoint: str | None = None, overrides: list[str] = (), keep_ties: bool = False,
                     pairs: str = "best_worst") -> dict:
    """Write the dataset to ``out``; returns {"records", "prompts", "ties", "nfe", "manifest"}."""
    from flowrl.config import load_config
    from flowrl.objectives.pairs import form_pairs
    from flowrl.training.scoring import score_samples
    from flowrl.training.trainer import Trainer

    if candidates < 2 or prompts < 1:
        raise ValueError(f"make_preferences: need candidates >= 2 and prompts >= 1, got {candidates}, {prompts}")
    import tempfile

    out = Path(out)
    per_iter = min(prompts, 8)
    scratch = tempfile.mkdtemp(prefix="make_preferences_")      # the trainer's run directory (nothing is kept)
    mine = [f"run.seed={seed}", f"train.group_size={candidates}", f"train.prompts_per_iter={per_iter}",
            "eval.every=0", f"run.output_dir={scratch}", "log.progress=false"]
    cfg = load_config(recipe, [*overrides, *mine])
    if getattr(cfg.objective.config, "data", None) is not None:     # sample with the objective's online form
        cfg = load_config(recipe, [*overrides, "objective.data=null", *mine])
    trainer = Trainer(cfg)
    policy = trainer.policy
    if checkpoint is not None:
        from flowrl.checkpoint import load_checkpoint, resolve_checkpoint

        tensors, _ = load_checkpoint(resolve_checkpoint(checkpoint), map_location="cpu")
        policy.load_adapter_state_dict(tensors["train"], "old")
    records, ties, nfe, it = [], 0, 0, 0
    while it * per_iter < prompts:
        samples = trainer.rollout.run(it)
        total = torch.nan_to_num(score_samples(trainer.parts.rewards, trainer.dist, samples).R)
        total = (total * trainer.advantages.weights.to(total)).sum(1)
        per_record = samples.rollout_nfe // per_iter
        for p in range(min(per_iter, prompts - it * per_iter)):
            rows = torch.nonzero(samples.group_ids == p).flatten()
            nfe += per_record
            win, lose = form_pairs(total[rows], torch.zeros(rows.numel(), dtype=torch.long), pairs)
            win, lose = rows[win].tolist(), rows[lose].tolist()
            kept = [(w, lo) for w, lo in zip(win, lose) if keep_ties or total[w] > total[lo]]
            if not kept:
                ties += 1
                continue
            costs = [per_record // len(kept) + (i < per_record % len(kept)) for i in range(len(kept))]
            for (w, lo), cost in zip(kept, costs):             # a prompt's NFEs spread over its pairs
                n = len(records)
                save_image(samples.pixels[w], out / "images" / f"{n:06d}_w.png")
                save_image(samples.pixels[lo], out / "images" / f"{n:06d}_l.png")
                records.append({"prompt": samples.prompts[w], "chosen": f"images/{n:06d}_w.png",
                                "rejected": f"images/{n:06d}_l.png", "meta": samples.meta[w],
                                "chosen_score": round(float(total[w]), 6),
                                "rejected_score": round(float(total[lo]), 6), "nfe": cost})
        it += 1
    if ties and records:                        # the NFEs of the left-out prompts are spread over the kept records
        extra, rest = divmod(ties * per_record, len(records))
        for i, r in enumerate(records):
            r["nfe"] += extra + (i < rest)
    manifest = write_manifest(records, out)
    print(f"[make_preferences] {len(records)} records from {prompts} prompts × {candidates} candidates "
          f"({ties} tied prompts left out), {nfe} NFEs → {manifest}", file=sys.stderr)
    return {"records": len(records), "prompts": prompts, "ties": ties, "nfe": nfe, "manifest": str(manifest)}
