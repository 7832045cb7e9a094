"""Adapter-switch benchmark: the CPU cost of switching LoRA weight sets ("train", "old", the base) on full-size
transformers, flowrl's ``lora.activate`` against the same switch written with peft's calls alone, side by side.

    python scripts/bench.py adapters [--families sd3 flux wan --repeats 5] [--quick]

A policy switches adapters around model calls: to "old" for each rollout chunk, to the base (None) for each
KL-reference forward, back to "train". Each switch visits every peft tuner layer in Python, so its cost grows
with the model, not with the batch, and it is paid on the CPU while the accelerator waits. The transformers are
built on the meta device from the published configs (``configs/gpu/``) with the family's default LoRA targets
(no weights, no download); only the Python walk is measured. Prints
``{"bench": "adapters", "families": {name: {"switch_ms_peft", "switch_ms_flowrl", "switch_ms_ratio", ...}},
"switches_per_iteration_before", "switches_per_iteration_after", "switch_count_ratio", "switch_cpu_ratio"}``:
  switch_ms_*        process CPU ms of one switch, averaged over train→old→train and train→None→train cycles
                     (fastest of ``--repeats`` alternated runs)
  switches_per_iteration_*  switches in one tiny SD3.5 GRPO iteration with β_KL > 0 (the recipe's 0.01):
                     "before" as if every ``TransformerWeights.use`` switched twice (in and out), "after" counted
  switch_cpu_ratio   switch_count_ratio × the mean switch_ms_ratio: the adapter-switch CPU time of an iteration
                     after / before
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

import torch

from flowrl.bench.benchmarks.gpu import build_transformer, load_config, shrink
from flowrl.policies import lora

FAMILY_LORA = {"sd3": "flowrl.policies.sd3", "flux": "flowrl.policies.flux", "wan": "flowrl.policies.wan"}
CYCLES = (("old", "train"), (None, "train"))     # rollout chunk; KL-reference forward


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=list(FAMILY_LORA), choices=list(FAMILY_LORA))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=4, help="switch cycles per timed run")
    ap.add_argument("--quick", action="store_true", help="check that it runs: test-size models, 1 repeat")
    return ap.parse_args(argv)


def peft_switch(model, name: str | None, trainable: str | None = lora.TRAIN, layers=None) -> None:
    """The switch with peft's calls alone: ``set_adapter`` + ``enable_adapters`` on every layer, then the same
    one-pass grads as ``lora.activate`` (``lora.set_trainable``), so the two differ only in the peft calls
    ``activate`` skips. The state ``activate`` must leave, and its baseline (one walk of the module tree, given
    ``layers``)."""
    layers = lora.tuner_layers(model) if layers is None else layers
    for _, m in layers:
        if name is None:
            m.enable_adapters(False)
        else:
            m.set_adapter(lora.peft_name(name))
            m.enable_adapters(True)
    lora.set_trainable(model, trainable, layers)


def meta_model(family: str, quick: bool):
    """The family's transformer on the meta device with its default LoRA adapters ("train", "old") injected."""
    import importlib
    import warnings

    from peft import inject_adapter_in_model

    cfg = load_config(family)
    model = build_transformer(shrink(family, cfg) if quick else cfg, "meta", torch.bfloat16)
    lcfg = importlib.import_module(FAMILY_LORA[family]).Config().lora
    with warnings.catch_warnings():  # add_adapters' injection; its float32 cast and copy need real tensors
        warnings.filterwarnings("ignore", message=".*multiple adapters.*")
        for name in lcfg.names:
            inject_adapter_in_model(lcfg.to_peft(lora.expand_targets(model, lcfg.target_modules)), model,
                                    adapter_name=lora.peft_name(name))
    return model


def switch_ms(family: str, args) -> dict:
    model = meta_model(family, args.quick)
    layers = lora.tuner_layers(model)
    ways = {"peft": lambda n: peft_switch(model, n, layers=layers),
            "flowrl": lambda n: lora.activate(model, n, layers=layers)}
    best = {k: float("inf") for k in ways}
    for _ in range(args.repeats):
        for k, switch in ways.items():
            t0 = time.process_time()
            for _ in range(args.cycles):
                for there, back in CYCLES:
                    switch(there)
                    switch(back)
            best[k] = min(best[k], (time.process_time() - t0) * 1000 / (args.cycles * 2 * len(CYCLES)))
    modules = sum(1 for _ in model.named_modules())
    return {"modules": modules, "tuner_layers": len(layers), "switch_ms_peft": best["peft"],
            "switch_ms_flowrl": best["flowrl"], "switch_ms_ratio": best["flowrl"] / best["peft"]}


def iteration_switches(tmp: str) -> dict:
    """``use`` calls and actual switches of one tiny SD3.5 GRPO iteration (the recipe's β_KL = 0.01)."""
    from flowrl.bench.paths import REPO
    from flowrl.config import load_config as load_run
    from flowrl.distributed.processes import make_accelerator
    from flowrl.policies import weights
    from flowrl.training.trainer import Trainer

    uses, switches = Counter(), Counter()
    orig_use, orig_activate = weights.TransformerWeights.use, lora.activate

    def use(self, name):
        uses[(self.active, name)] += 1
        return orig_use(self, name)

    def activate(*a, **k):
        switches[a[1]] += 1
        return orig_activate(*a, **k)

    cfg = load_run(REPO / "configs/sd35/grpo_pickscore.yaml", [
        "policy.tiny=true", "policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16",
        "sampler.steps=4", "train.iterations=1", "train.prompts_per_iter=2", "train.group_size=4",
        "train.micro_batch=2", "eval.before=false", "eval.after=false", "checkpoint.every=0",
        "rewards={jpeg_compressibility: {weight: 1.0}}", f"run.output_dir={tmp}", "log.progress=false",
        "policy.lora={rank: 2, alpha: 4, target_modules: [to_q, to_v]}", "eval.held_out=[]"])
    trainer = Trainer(cfg, accelerator=make_accelerator("no", cpu=True))   # counts, not speed: one CPU process
    weights.TransformerWeights.use, lora.activate = use, activate
    try:
        trainer.iteration(0)
    finally:
        weights.TransformerWeights.use, lora.activate = orig_use, orig_activate
    return {"uses": {f"{a}->{b}": n for (a, b), n in sorted(uses.items(), key=str)},
            "before": 2 * sum(uses.values()), "after": sum(switches.values()),
            "beta_kl": cfg.objective.config.beta_kl}


def main(argv: list[str]) -> dict:
    import tempfile

    args = parse(argv)
    if args.quick:
        args.repeats, args.cycles, args.families = 1, 1, args.families[:1]
    torch.set_num_threads(1)
    fams = {f: switch_ms(f, args) for f in args.families}
    with tempfile.TemporaryDirectory() as tmp:
        count = iteration_switches(tmp)
    ms_ratio = sum(r["switch_ms_ratio"] for r in fams.values()) / len(fams)
    count_ratio = count["after"] / count["before"]
    return {"bench": "adapters", "quick": args.quick, "families": fams,
            "switches_per_iteration_before": count["before"], "switches_per_iteration_after": count["after"],
            "uses_per_iteration": count["uses"], "beta_kl": count["beta_kl"],
            "switch_count_ratio": count_ratio, "switch_cpu_ratio": count_ratio * ms_ratio,
            "timing": f"process CPU time, 1 thread, fastest of {args.repeats} alternated runs of {args.cycles} "
                      "cycles each (train→old→train, train→None→train)"}
