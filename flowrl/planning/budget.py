"""Per-process memory of a run: every resident item, the two activation phases, the peak and the verdict.

    peak = Σ resident + max(rollout forward at sampler.chunk rows, training forward + backward at micro_batch rows)
           + FSDP's gathered units (the root + (3 + 1/N) blocks)      where sharded

FSDP2 keeps the root unit gathered through a call and, per block, the running block's unsharded weights plus the
prefetched next block's all-gather input (its 1/N shard copied), output and copy-out destination: 3 + 1/N blocks
(measured on the toy transformer, 2 CPU processes: 3.3 blocks above the unsharded peak with grad, 2.75 without).

Resident: transformer weights (load dtype; _keep_in_fp32 modules 4 bytes), LoRA adapters (float32, every name:
"train", "old", …), full fine-tune's frozen "old" and base copies, gradients and AdamW's two moments of the
trainable parameters (their dtype: float32 for LoRA), the eval EMA (float32), text encoders (load dtype) and VAE
(float32), and this process's stored samples (trajectory x, x_next, mean per stored step + final latents in
float32, text conditioning with its uncond part, decoded pixels). FSDP (``dist.fsdp``, N > 1) divides the
transformer items by N (process 0's chunk ⌈d₀/N⌉); with ``dist.reduce_per_step`` gradients accumulate
unsharded over a step's passes, so they are not divided. Not counted: reward models, VAE-decode and reward
activations, the CUDA context and allocator slack (``HEADROOM_GIB`` is kept free for them).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

GiB = 2**30
HEADROOM_GIB = 1.5              # CUDA context, NCCL buffers, allocator fragmentation: not planned, kept free
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CFG_ONE_BATCH = ("sd3", "toy")   # CFG doubles the forward batch ([uncond; cond]); Wan makes two forwards


@dataclass
class Plan:
    """A planned run: bytes per process by item, the activation phases, the peak and what would change it."""

    family: str
    model: str
    gpus: int
    gpu_mem_gib: float
    sharded: bool
    items: dict[str, int]
    phases: dict[str, int]          # rollout / train activations, FSDP gathered units
    peak: int
    counts: dict = field(default_factory=dict)
    remedies: list[dict] = field(default_factory=list)

    @property
    def usable(self) -> float:
        return (self.gpu_mem_gib - HEADROOM_GIB) * GiB

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable

    def as_dict(self) -> dict:
        return {"family": self.family, "model": self.model, "gpus": self.gpus, "gpu_mem_gib": self.gpu_mem_gib,
                "sharded": self.sharded, "peak_gib": round(self.peak / GiB, 3), "fits": self.fits,
                "items_gib": {k: round(v / GiB, 4) for k, v in self.items.items()},
                "phases_gib": {k: round(v / GiB, 4) for k, v in self.phases.items()},
                "counts": self.counts, "remedies": self.remedies}


def guidance(cfg) -> tuple[float, float]:
    """(rollout guidance, training-forward guidance): ``sampler.guidance`` (None → the family default), the
    objective's ``train_guidance`` (None → the rollout's)."""
    g = cfg.sampler.guidance if cfg.sampler.guidance is not None else cfg.policy.config.guidance
    if g is None:          # the checkpoint decides (HunyuanVideo-1.5's guider): plan with CFG on, an upper bound
        g = 2.0
    tg = getattr(cfg.objective.config, "train_guidance", None)
    return g, g if tg is None else tg


def cfg_rows(family: str, cfg, w: float, grad: bool) -> int:
    """Rows per requested row: 2 with CFG in one batch (SD3, toy) or, under grad, two retained forwards (Wan,
    FLUX true CFG); LTX-2 under grad: one retained forward per guidance term on (CFG, STG, modality); 1 otherwise."""
    if family == "ltx2":             # audio scales: the field, or the video one (ltx2_guidance._scales)
        pc = cfg.policy.config
        terms = (max(w, pc.audio_guidance or w) > 1, max(pc.stg_scale, pc.audio_stg_scale or pc.stg_scale) > 0,
                 max(pc.modality_scale, pc.audio_modality_scale or pc.modality_scale) > 1)
        return 1 + sum(terms) if grad else 1
    if family == "flux":
        return 2 if grad and getattr(cfg.policy.config, "true_cfg", 1.0) > 1 else 1
    return 2 if w > 1 and (family in CFG_ONE_BATCH or grad) else 1


def stored_steps(cfg) -> int:
    """Stored (trained) steps of a rollout: all steps, less the last with ``window.skip_last`` (an upper bound for
    windows that store fewer)."""
    return cfg.sampler.steps - int(bool(getattr(cfg.sampler.window.config, "skip_last", False)))


def plan(cfg, gpus: int = 1, gpu_mem: float = 80.0, remedies: bool = True) -> Plan:
    """The per-process plan of ``cfg`` (a ``RunConfig``) on ``gpus`` processes of ``gpu_mem`` GiB."""
    from flowrl.objectives import get_objective
    from flowrl.planning.activations import coefficients
    from flowrl.planning.geometry import geometry
    from flowrl.planning.models import EXPERTS, count

    family, load, pc, t, s = cfg.policy.kind, cfg.policy.common, cfg.policy.config, cfg.train, cfg.sampler
    lora = pc.lora
    c = count(family, load.path, load.tiny, lora)
    e = 4 if load.tiny else BYTES[load.dtype]
    ec = 2 if cfg.run.mixed_precision != "no" else e                       # compute dtype of activations
    n = gpus
    sharded = cfg.dist.fsdp and n > 1
    frac = c.shard(n) / c.transformer if sharded else 1.0
    weights = ((c.transformer - c.fp32_params) * e + c.fp32_params * 4) * frac
    experts = EXPERTS.get(family, 1)              # Wan2.2-A14B: both experts resident, one runs per step
    trained = min(experts, len(getattr(pc, "train_experts", ()) or (1,)))
    trainable, tb = (c.lora * trained, 4) if lora is not None else (c.transformer * trained, e)
    local = cfg.samples_per_iter // n
    per_update = max(1, local // t.updates_per_epoch)
    mb = min(t.micro_batch, per_update)
    objective = get_objective(cfg.objective.kind, cfg.objective.config)
    trajectory = objective.TRAINS_ON.stores_trajectory
    multi_pass = per_update > mb or (trajectory and stored_steps(cfg) > 1)
    grad_frac = 1.0 if sharded and cfg.dist.reduce_per_step and multi_pass else frac
    items = {"transformer weights" + (f" ({experts} experts)" if experts > 1 else ""): experts * weights}
    if lora is not None:
        items[f"LoRA adapters ({', '.join(lora.names)})"] = len(lora.names) * c.lora * 4 * frac * trained
    else:
        items["frozen copies (old" + (", base)" if pc.keep_base else ")")] = (1 + int(pc.keep_base)) * weights * trained
    items["gradients"] = trainable * tb * grad_frac
    items["AdamW moments (2×)"] = 2 * trainable * tb * frac
    if t.ema_decay is not None:
        items["EMA (float32)"] = trainable * 4 * frac
    items["text encoders"] = sum(c.text.values()) * e
    if c.vae:
        items["VAE (float32)"] = c.vae * 4
    w, tw = guidance(cfg)
    g = geometry(family, c.config, load.tiny, s.height, s.width, s.num_frames, getattr(pc, "max_sequence_length", None),
                 getattr(pc, "frame_rate", 24.0))
    states = 3 * stored_steps(cfg) + 1 if trajectory else 1
    uncond = 2 if w > 1 or getattr(pc, "true_cfg", 1.0) > 1 else 1
    items["stored samples"] = local * (g.latent * 4 * states + g.cond * e * uncond + g.pixels * 4)
    units = len(c.blocks) / (2 if family == "flux" else 1)
    k = coefficients(family, json.dumps(c.config, sort_keys=True), lora.rank if lora is not None else None,
                     g.image_tokens, g.text_tokens, g.audio_tokens)
    unit = g.tokens * g.width * ec
    chunk = min(s.chunk or local, local)
    rollout = chunk * cfg_rows(family, cfg, w, False) * unit * k.forward
    train_rows = mb * cfg_rows(family, cfg, tw, True)
    train = train_rows * unit * k.train(units, pc.gradient_checkpointing)
    if getattr(cfg.objective.config, "beta_kl", 0) > 0:                # a reference forward while the graph lives
        train = max(train, train_rows * unit * (k.held(units, pc.gradient_checkpointing) + k.forward))
    adapters_per_block = len(lora.names) * c.lora * 4 / len(c.blocks) if lora is not None else 0
    gathered = c.root * ec + (3 + 1 / n) * (max(c.blocks) * ec + adapters_per_block)
    phases = {"rollout activations": rollout, "train activations": train,
              "FSDP gathered units": gathered if sharded else 0}
    peak = sum(items.values()) + max(rollout, train) + phases["FSDP gathered units"]
    model = f"{family}{' tiny' if load.tiny else ''} ({c.transformer / 1e9:.3g}B transformer)"
    counts = {"transformer": c.transformer, "lora_per_adapter": c.lora, "text_encoders": c.text, "vae": c.vae,
              "tokens": g.tokens, "width": g.width, "blocks": len(c.blocks), "train_rows": train_rows,
              "rollout_rows": chunk * cfg_rows(family, cfg, w, False)}
    out = Plan(family, model, n, gpu_mem, sharded, {k_: int(v) for k_, v in items.items()},
               {k_: int(v) for k_, v in phases.items()}, int(peak), counts)
    if remedies:
        out.remedies = remedy_effects(cfg, out)
    return out


def remedy_effects(cfg, base: Plan) -> list[dict]:
    """Each single change's predicted peak, in the order to try them (the least intrusive first)."""
    from flowrl.config.loader import replace_nested

    pc, t, s = cfg.policy.config, cfg.train, cfg.sampler
    options = []
    if base.gpus > 1 and not cfg.dist.fsdp:
        options.append(("dist.fsdp=true", {"dist.fsdp": True}))
    if not pc.gradient_checkpointing:
        options.append(("policy.gradient_checkpointing=true", {"policy.gradient_checkpointing": True}))
    if base.sharded and cfg.dist.reduce_per_step and pc.lora is None:
        options.append(("dist.reduce_per_step=false", {"dist.reduce_per_step": False}))
    if base.counts["train_rows"] > 1 and t.micro_batch > 1:
        half = max(1, t.micro_batch // 2)
        options.append((f"train.micro_batch={half}", {"train.micro_batch": half}))
    if (s.chunk or 2) > 1:
        half = max(1, (s.chunk or 2) // 2)
        options.append((f"sampler.chunk={half}", {"sampler.chunk": half}))
    if pc.lora is None:
        default = type(pc)().lora
        options.append((f"policy.lora={{rank: {default.rank}}}", {"policy.lora": default}))
    out = []
    for label, change in options:
        try:
            p = plan(replace_nested(cfg, **change), base.gpus, base.gpu_mem_gib, remedies=False)
        except Exception as err:                          # a change the config cannot take (e.g. geometry)
            out.append({"change": label, "error": str(err).splitlines()[0]})
            continue
        out.append({"change": label, "peak_gib": round(p.peak / GiB, 3),
                    "saves_gib": round((base.peak - p.peak) / GiB, 3), "fits": p.fits})
    if base.gpus == 1 or not base.sharded:
        more = dataclasses.replace(cfg.dist, fsdp=True)
        p = plan(replace_nested(cfg, dist=more), max(8, base.gpus * 2) if base.gpus > 1 else 8, base.gpu_mem_gib,
                 remedies=False)
        out.append({"change": f"{p.gpus} GPUs with dist.fsdp=true", "peak_gib": round(p.peak / GiB, 3),
                    "saves_gib": round((base.peak - p.peak) / GiB, 3), "fits": p.fits})
    return out
