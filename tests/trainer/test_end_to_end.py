"""A few iterations of every objective, end to end through the one loop: on the toy policy (all objectives,
with before/after evaluation grids) and on tiny SD3, FLUX and Wan policies (one objective each)."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import toy_overrides

from flowrl.config import load_config
from flowrl.training.trainer import Trainer


def check_trained(t: Trainer, out: dict, run_dir: Path, start: dict) -> list[dict]:
    assert out["state"]["iteration"] == t.cfg.train.iterations
    assert out["state"]["global_step"] == t.cfg.train.iterations * t.cfg.train.updates_per_epoch
    assert out["state"]["skipped_updates"] == 0
    end = t.policy.adapter_state_dict("train")
    assert any(not torch.equal(v, end[k]) for k, v in start.items()), "the train adapter did not move"
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_recs = [r for r in recs if "loss/total" in r]
    assert len(train_recs) == t.cfg.train.iterations
    for key in ("reward/total/mean", "adv/abs_mean", "train/grad_norm", "time/samples_per_s", "train/rollout_nfe"):
        assert train_recs[-1][key] is not None, key
    assert (run_dir / "config.yaml").is_file() and list((run_dir / "checkpoints").glob("step_*"))
    return train_recs


@pytest.mark.parametrize("objective", ["grpo", "nft", "awr", "awm"])
def test_toy_objective_end_to_end(tmp_path, objective):
    cfg = load_config(None, toy_overrides(tmp_path, objective))
    t = Trainer(cfg)
    start = {k: v.clone() for k, v in t.policy.adapter_state_dict("train").items()}
    out = t.run()
    recs = check_trained(t, out, tmp_path / "run", start)
    if objective == "grpo":
        assert {"loss/ratio", "loss/clipfrac", "loss/kl"} <= set(recs[-1])
    assert "eval/shapes/mean" in out["before"] and "eval/shapes/mean" in out["after"]
    assert "eval/palette_distance/mean" in out["after"]
    for tag in ("before", "after"):
        assert (tmp_path / "run" / "eval" / tag / "grid_000.png").is_file()
    assert out["before_after"] == tmp_path / "run" / "eval" / "before_after.png" and out["before_after"].is_file()
    assert "after/index.html" in (tmp_path / "run" / "eval" / "index.html").read_text()


TINY = {  # family: (objective, kernel, extra overrides)
    "sd3": ("grpo", "flow_sde", ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16"]),
    "flux": ("nft", "ode", ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16",
                            "objective.timesteps.fraction=0.5"]),
    "wan": ("awr", "ode", ["policy.max_sequence_length=8", "sampler.height=16", "sampler.width=16",
                           "objective.timesteps.fraction=0.5",
                           "sampler.num_frames=5", "rewards={video_frame_mean: {weight: 1.0, kwargs: "
                           "{reward: jpeg_compressibility}}}"]),
}


@pytest.mark.parametrize("family", sorted(TINY))
def test_tiny_model_families_end_to_end(tmp_path, family):
    objective, kernel, extra = TINY[family]
    ov = [
        f"policy.kind={family}", "policy.tiny=true", "policy.lora={rank: 2, alpha: 4, target_modules: [to_q, to_v]}",
        f"objective.kind={objective}", f"sampler.kernel.kind={kernel}", "sampler.steps=2",
        "rewards={jpeg_compressibility: 1.0}", "train.iterations=1", "train.prompts_per_iter=2", "train.group_size=2",
        "train.micro_batch=2", "sampler.chunk=2", "train.updates_per_epoch=2",
        "data.train=configs/prompts/video_test.txt", "eval.before=false", "eval.after=false",
        f"run.output_dir={tmp_path}", "run.name=run", "log.progress=false",
    ] + extra
    cfg = load_config(None, ov)
    t = Trainer(cfg)
    start = {k: v.clone() for k, v in t.policy.adapter_state_dict("train").items()}
    check_trained(t, t.run(), tmp_path / "run", start)


def test_multi_reward_marble_gets_its_gram_and_logs_alpha(tmp_path):
    ov = toy_overrides(tmp_path, "nft") + ["rewards={shapes: 1.0, shapes_clean: 0.5}",
                                           "advantage.balancer={kind: marble, solve_every: 1}",
                                           "eval.before=false", "eval.after=false"]
    t = Trainer(load_config(None, ov))
    start = {k: v.clone() for k, v in t.policy.adapter_state_dict("train").items()}
    recs = check_trained(t, t.run(), tmp_path / "run", start)
    assert recs[-1]["adv/solved"] == 1 and abs(recs[-1]["adv/alpha_0"] + recs[-1]["adv/alpha_1"] - 1) < 1e-5
    assert t.parts.balancer_state["solves"] == 2


def test_full_fine_tune_trains_every_transformer_weight(tmp_path):
    ov = toy_overrides(tmp_path, "nft", iterations=1) + ["policy.lora=null", "eval.before=false", "eval.after=false"]
    t = Trainer(load_config(None, ov))
    assert len(t.parts.params) == len(list(t.policy.transformer.parameters()))
    start = {k: v.clone() for k, v in t.policy.adapter_state_dict("train").items()}
    check_trained(t, t.run(), tmp_path / "run", start)
