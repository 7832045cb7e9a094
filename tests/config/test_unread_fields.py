"""One owner per setting: every recipe in configs/ runs one tiny iteration (tiny models, tiny sizes, offline
rewards), and every schema field must have been read by some component. Fields read only on paths a CPU test
cannot take are in ALLOWED, each with the reason."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from read_tracker import tracking

from flowrl.config import load_config
from flowrl.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
RL_RECIPES = sorted(p for p in (REPO / "configs").rglob("*.yaml")
                    if p.parent.name not in ("distill", "accelerate") and "prompts" not in p.parts)

ALLOWED = {
    # weights come from a checkpoint only in real runs; tiny policies are built from config objects
    "policy.path": "read by from_pretrained (real checkpoints); tiny runs build from config",
    "policy.dtype": "read by from_pretrained (real checkpoints); tiny runs build from config",
    # the accelerator is passed in below (one CPU process)
    "run.mixed_precision": "read by make_accelerator; the test passes its own CPU accelerator",
    "run.cpu": "read by make_accelerator; the test passes its own CPU accelerator",
    # output switches read only when the logger backend is on
    "log.project": "read when log.wandb is true (needs the wandb package and an account)",
}
# Settings that matter only under another setting: (prefix, applies(cfg), reason) — unread is fine where the
# condition says the setting cannot matter.
CONDITIONAL = [
    ("sampler.window.", lambda c: _kernel(c).stochastic, "which steps are SDE: deterministic kernels have none"),
    ("sampler.kernel.sigma_", lambda c: getattr(c.sampler.kernel.config, "variant", "") == "wan",
     "flow_sde's σ range is read by its Wan variant only"),
    ("objective.kl_form", lambda c: c.objective.config.beta_kl > 0, "the KL form matters only with β_KL > 0"),
    ("objective.inner.kl_form", lambda c: getattr(c.objective.config.inner.config, "beta_kl", 0) > 0,
     "a wrapped objective's KL form matters only with β_KL > 0"),
    *[(pre, lambda c: not _offline(c), "an offline objective trains on its dataset: no rollout, no advantage stage")
      for pre in ("advantage.", "sampler.chunk", "sampler.log_prob_reduce", "objective.pair_by",
                  "sampler.correction")],
    ("objective.route_by", lambda c: len(getattr(c.objective.config, "teachers", {})) > 1,
     "routing by prompt metadata matters only with several teachers"),
    ("policy.stg_blocks", lambda c: bool(getattr(c.policy.config, "stg_scale", 0)
                                         or getattr(c.policy.config, "audio_stg_scale", 0)),
     "LTX-2's STG blocks are read only when spatio-temporal guidance is on"),
    ("policy.image_crf", lambda c: c.data.train.endswith(".jsonl") and '"image' in Path(c.data.train).read_text(),
     "LTX-2 re-compresses first frames only: a text-to-video run has none"),
    ("train.ema_every", lambda c: c.train.ema_decay is not None, "the eval EMA's interval: off when ema_decay null"),
    ("dist.reshard_after_forward", lambda c: c.dist.fsdp,
     "read when the policy is sharded (dist.fsdp on more than one process); the test runs one process"),
    ("dist.reduce_per_step", lambda c: c.dist.fsdp,
     "read when the policy is sharded (dist.fsdp on more than one process); the test runs one process"),
]
FAMILY_OVERRIDES = {
    "toy": [],
    "toy_video": ["sampler.num_frames=4", "sampler.steps=3"],     # the tiny preset: 4-frame clips, 3 steps
    "sd3": ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16"],
    "flux": ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16"],
    "wan": ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16", "sampler.num_frames=5"],
    "flux2": ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16"],
    "flux2_klein": ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16"],
    "zimage": ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16"],
    "qwen_image": ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16", "sampler.steps=3"],
    # the edit pipeline resizes sources to 1024² pixels; the tiny run uses 32² (16 reference tokens)
    "qwen_image_edit": ["policy.reference_area=1024", "sampler.height=16", "sampler.width=16", "sampler.steps=3"],
    "qwen_image_edit_plus": ["policy.reference_area=1024", "policy.condition_area=1024", "sampler.steps=3",
                             "sampler.height=16",
                             "sampler.width=16"],
    "wan22": ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16", "sampler.num_frames=5",
              "sampler.steps=4", "policy.train_experts=[transformer, transformer_2]"],   # both experts run
    "wan22_i2v": ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16", "sampler.num_frames=5",
                  "sampler.steps=4", "sampler.eval_steps=2"],
    "hunyuan15": ["policy.max_sequence_length=300", "sampler.height=8", "sampler.width=8", "sampler.num_frames=5",
                  "sampler.steps=2"],
    # first frames through the recipe's H.264 round trip (PyAV is in the dev extra)
    "ltx2": ["policy.max_sequence_length=8", "sampler.height=8", "sampler.width=8", "sampler.num_frames=9",
             "sampler.steps=4", "sampler.window.window_range=[0, 3]"],
}
TINY_STEPS = 4   # rollout steps of a tiny run: enough for a window, a boundary and an ODE tail
VIDEO = ("wan", "wan22", "wan22_i2v", "hunyuan15", "ltx2")
OFFLINE_REWARDS = ("toy", "toy_video")   # the shapes worlds: their verifiers run offline, the recipe's LoRA is kept


def _offline(cfg) -> bool:
    from flowrl.objectives import get_objective

    return get_objective(cfg.objective.kind, cfg.objective.config).TRAINS_ON.offline


def _kernel(cfg):
    from samplers import KERNELS

    return KERNELS.get(cfg.sampler.kernel.kind)


def excused(field: str, cfg) -> bool:
    return field in ALLOWED or any(field.startswith(pre) and not applies(cfg) for pre, applies, _ in CONDITIONAL)


def tiny_overrides(cfg, tmp_path) -> list[str]:
    """Shrink a recipe to one CPU iteration; rewards that need downloads become an offline stand-in."""
    group = ["train.prompts_per_iter=1"] if cfg.sampler.tree is not None else [   # a tree's leaves are its group
        "train.prompts_per_iter=2", "train.group_size=2"]
    ov = ["policy.tiny=true", "train.iterations=1", *group,
          "train.micro_batch=2", "train.updates_per_epoch=1", "sampler.eval_steps=2",
          "eval.num_prompts=2", "eval.seeds=[0]", "eval.batch=2", "eval.held_out=[]", "eval.every=1",
          "checkpoint.every=1", f"run.output_dir={tmp_path}", "run.name=run", "log.progress=false"]
    ov += FAMILY_OVERRIDES[cfg.policy.kind]
    if cfg.sampler.tree is None and not any(o.startswith("sampler.steps=") for o in ov):
        ov.append(f"sampler.steps={min(cfg.sampler.steps, TINY_STEPS)}")   # a tree keeps its split depths
    if cfg.sampler.pool is not None:
        ov.append("sampler.pool.candidates=4")
        if cfg.sampler.pool.scout.kind == "fp4":       # tiny layers are below the real-size eligibility floor
            ov.append("sampler.pool.scout.min_dim=0")
    if "teachers" in getattr(cfg.objective.config, "__dataclass_fields__", {}):   # distillation teachers are
        ov.append("objective.teachers={" + ", ".join(f"{n}: base" for n in cfg.objective.config.teachers) + "}")
        # trained checkpoints of the real-size model; the tiny run distils from its frozen base
    if getattr(cfg.objective.config, "pairs", None) == "all_pairs":   # a tiny random model scores every sample
        ov.append("objective.pairs=best_worst")      # alike: all_pairs has no strict pair, best_worst still pairs
    if cfg.policy.kind not in OFFLINE_REWARDS:         # tiny LoRA; an objective's extra adapters kept
        names = getattr(getattr(cfg.policy.config, "lora", None), "names", None)
        keep = f", names: [{', '.join(names)}]" if names else ""
        ov.append("policy.lora={rank: 2, alpha: 4, target_modules: [to_q, to_v]" + keep + "}")
    if cfg.policy.kind in VIDEO:                      # learned rewards need downloads: an offline stand-in
        ov.append("rewards={video_jpeg: {reward: video_frame_mean, weight: 1.0, "
                  "kwargs: {reward: jpeg_compressibility}}}")
    elif cfg.policy.kind.startswith("qwen_image_edit"):   # an offline reward that reads the prompts' sources
        ov.append("rewards={source_fidelity: {weight: 1.0}}")
    elif cfg.policy.kind not in OFFLINE_REWARDS:
        ov.append("rewards={jpeg_compressibility: {weight: 1.0}}")
    return ov


@pytest.mark.parametrize("recipe", RL_RECIPES, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_every_field_of_the_recipe_is_read(recipe, tmp_path):
    from flowrl.distributed.processes import make_accelerator

    cfg = load_config(recipe)
    cfg = load_config(recipe, tiny_overrides(cfg, tmp_path))
    with tracking(cfg) as t:
        Trainer(cfg, accelerator=make_accelerator("no", cpu=True)).run()
    unread = {f for f in t.unread() if not excused(f, cfg)}
    assert not unread, f"{recipe.name}: fields nothing read (give each one an owner or delete it): {sorted(unread)}"
    if cfg.policy.kind == "toy_video":                      # the moving-shapes world's evaluations are video grids
        assert sorted(p.name for p in (tmp_path / "run" / "eval" / "after").glob("grid_*")) == ["grid_000.mp4"]
    if cfg.data.train.endswith(".jsonl") and '"image' in Path(cfg.data.train).read_text():
        pages = sorted(tmp_path.glob("run/eval/*/index.html"))   # image-conditioned prompts: grids show the sources
        assert pages and all("columns: source | seed" in page.read_text() for page in pages), pages


# ---- the streaming-distillation recipes (flowrl.distill.config: the run schema's run/data/checkpoint/log sections
# plus its own) -------------------------------------------------------------------------------------------------------
DISTILL_RECIPES = sorted((REPO / "configs" / "distill").glob("*.yaml"))
DISTILL_ALLOWED = {
    "model.student_init": "a checkpoint path: read when given (real runs); tiny and default runs init from the teacher",
    "model.critic_init": "a checkpoint path: read when given (real runs)",
    "model.student_original_key": "read with model.student_original (an original-format .pt)",
    "model.dtype": "read by the real loaders; tiny models are built in float32",
    "model.text_len": "read by the real UMT5 text encoder; the tiny recipes use the offline hash encoder",
    "run.resume": "read by DistillTrainer.open_run_dir (scripts/distill.py); the test calls fit on a fresh trainer",
    "run.restart": "read by DistillTrainer.open_run_dir (scripts/distill.py); the test calls fit on a fresh trainer",
    "run.preempt_signals": "the RL trainer's (flowrl/training/preemption.py); the distill loop does not stop on "
                           "signals yet (they keep their default action)",
    "data.eval": "read by scripts/distill.py --grid (the eval video grid's prompts)",
    "log.tensorboard": "read by DistillTrainer.logger (scripts/distill.py); the test calls fit without a logger",
    "log.wandb": "read by DistillTrainer.logger (scripts/distill.py); the test calls fit without a logger",
    "log.project": "read by DistillTrainer.logger when log.wandb is true",
    "method.video_lr_generator": "RMD's second stage, after method.chunk_stage_iterations",
    "method.video_lr_critic": "RMD's second stage, after method.chunk_stage_iterations",
    "method.video_critic_steps_per_generator": "RMD's second stage, after method.chunk_stage_iterations",
}


@pytest.mark.parametrize("recipe", DISTILL_RECIPES, ids=lambda p: p.name)
def test_every_field_of_the_distill_recipe_is_read(recipe, tmp_path):
    from flowrl.distill.config import load_config as load_distill
    from flowrl.distill.trainer import DistillTrainer
    from flowrl.policies.tiny import save_preset

    ov = [f"run.output_dir={tmp_path}", "run.name=run", "checkpoint.every=1", "train.iterations=1",
          "log.progress=false"]
    if not recipe.name.startswith("tiny"):       # the published recipes, on a tiny diffusers Wan checkpoint
        save_preset("wan", tmp_path / "wan")
        roles = ("teacher", "student_init", "critic_init", "text_encoder", "vae")
        prompts = REPO / "configs" / "distill" / "tiny_prompts.txt"
        ov += [f"model.{k}={tmp_path / 'wan'}" for k in roles]
        ov += ["rollout.num_frames=6", "rollout.height=4", "rollout.width=4", "model.text_len=16",
               "model.dtype=float32", 'run.mixed_precision="no"', f"data.train={prompts}", f"data.eval={prompts}",
               "model.chunk_frames=2", "model.window_frames=null", "model.sink_frames=0"]
        ov += {"rmd": ["method.chunk_teacher=''"],
               "stream_r1": ["method.axes={visual: 'flowrl.distill.toy_rewards:colorfulness'}",
                             "method.axis_kwargs={}"]}.get(load_distill(str(recipe)).method.kind, [])
    cfg = load_distill(str(recipe), ov)
    with tracking(cfg) as t:
        DistillTrainer(cfg).fit()
    unread = {f for f in t.unread() if f not in DISTILL_ALLOWED}
    assert not unread, f"{recipe.name}: fields nothing read (give each one an owner or delete it): {sorted(unread)}"
