"""Entry points: scripts/distill.py trains + checkpoints + samples; scripts/stream.py streams a checkpoint."""
import importlib.util
import json
import math
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"distill_script_{name}", REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_distill_then_stream(tmp_path, capsys):
    run = tmp_path / "run"
    out = load_script("distill").main(["--config", str(REPO / "configs/distill/tiny.yaml"), "--iterations", "2",
                                       "--sample", str(tmp_path / "s.mp4"), "--grid", str(tmp_path / "g.gif"),
                                       "--grid-prompts", "2", f"run.output_dir={tmp_path}", "run.name=run",
                                       "checkpoint.every=1", "log.progress=false"])
    assert out["end_step"] == 2 and (tmp_path / "s.mp4").stat().st_size > 0
    assert (tmp_path / "g.gif").stat().st_size > 0
    assert (run / "metrics.jsonl").read_text().count("\n") == 2
    again = load_script("distill").main(["--config", str(REPO / "configs/distill/tiny.yaml"), "--iterations", "3",
                                         "--resume", f"run.output_dir={tmp_path}", "run.name=run"])
    assert again["start_step"] == 2 and again["end_step"] == 3          # resumed, one more iteration
    capsys.readouterr()
    summary = load_script("stream").main(["--config", str(REPO / "configs/distill/tiny.yaml"), "--checkpoint",
                                          str(run), "--ema", "--out", str(tmp_path / "v.gif"),
                                          "--frames-dir", str(tmp_path / "frames")])
    lines = [json.loads(s) for s in capsys.readouterr().out.strip().splitlines()]
    assert [d["chunk"] for d in lines[:-1]] == [0, 1, 2]                 # one line per chunk, as emitted
    assert summary["frames"] == len(list((tmp_path / "frames").glob("*.png")))
    assert (tmp_path / "v.gif").stat().st_size > 0


def test_eval_grid_and_bf16_teacher(tmp_path):
    from flowrl.distill.components import tiny_wan
    from flowrl.distill.config import load_config
    from flowrl.distill.roles import bidirectional_score, build_roles
    from flowrl.distill.sample import eval_grid

    tiny_wan(1).save_pretrained(tmp_path / "ckpt" / "transformer")
    cfg = load_config(str(REPO / "configs/distill/tiny.yaml"),
                      ["model.tiny=false", f"model.teacher={tmp_path / 'ckpt'}", "model.dtype=bfloat16"])
    roles = build_roles(cfg.model)
    assert roles.teacher.transformer.dtype == torch.bfloat16
    assert roles.student.transformer.dtype == torch.float32            # float32 master weights
    v = bidirectional_score(roles.teacher)(torch.randn(1, 16, 6, 4, 4), torch.tensor([500.0]),
                                           torch.randn(1, 8, 32))
    assert v.dtype == torch.float32 and torch.isfinite(v).all()
    path = eval_grid({"student": roles.student, "teacher-as-causal": roles.critic}, roles, cfg,
                     ["a fox", "a boat"], str(tmp_path / "grid.gif"))
    assert Path(path).stat().st_size > 0


def test_stream_r1_reward_gradient_opt_in():
    from flowrl.distill import stream_r1
    from flowrl.distill.components import tiny_vae
    from flowrl.distill.objectives import Batch, stream_r1_weight

    class R:
        vae = tiny_vae(0)

    def fn(b):
        return b.pixels.mean(dim=(1, 2, 3, 4))

    x = torch.randn(1, 16, 3, 4, 4, requires_grad=True)
    extras = {"reward_fns": [fn], "balance": stream_r1.AxisBalance(1)}
    cfg = stream_r1.Config(axes={"visual": "x"})
    w, _ = stream_r1_weight(x, R, Batch(["p"], None, None), cfg, extras)
    assert not w.requires_grad and w.shape == (1, 1, 3, 4, 4)
    cfg.detach_weight = False
    w, _ = stream_r1_weight(x, R, Batch(["p"], None, None), cfg, extras)
    w.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0               # reward gradient reaches the student


def test_roles_from_wan_policy_train_one_step(tmp_path):
    """The flowrl WanPolicy (tiny, real UMT5 + tokenizer path) supplies teacher, text encoder and VAE."""
    from flowrl.distill.config import load_config
    from flowrl.distill.trainer import DistillTrainer

    cfg = load_config(str(REPO / "configs/distill/tiny.yaml"),
                      ["model.policy=tiny", "model.text_len=16", f"run.output_dir={tmp_path}", "checkpoint.every=100"])
    tr = DistillTrainer(cfg)
    assert tr.roles.text_encoder(["a fox"]).shape == (1, 16, 32)
    metrics = tr.train_step(0)
    assert {"loss/generator", "loss/critic"} <= set(metrics)


def test_published_recipes_run_through_real_loaders(tmp_path):
    """Each Wan2.1-1.3B recipe, pointed at a tiny diffusers Wan checkpoint dir (transformer, UMT5 + tokenizer,
    VAE loaded by their from_pretrained), trains one step end to end with its own hyper-parameters."""
    from flowrl.distill.config import load_config
    from flowrl.distill.trainer import DistillTrainer
    from flowrl.policies.tiny import save_preset

    ckpt = tmp_path / "wan"
    save_preset("wan", ckpt)
    paths = [f"model.{k}={ckpt}" for k in ("teacher", "student_init", "critic_init", "text_encoder", "vae")]
    prompts = REPO / "configs/distill/tiny_prompts.txt"
    small = ["rollout.num_frames=6", "rollout.height=4", "rollout.width=4", "model.text_len=16",
             "model.dtype=float32", 'run.mixed_precision="no"', f"data.train={prompts}", f"data.eval={prompts}",
             "checkpoint.every=100", "model.chunk_frames=2", "model.window_frames=null", "model.sink_frames=0"]
    own = {"wan2.1_1.3b_self_forcing.yaml": [], "wan2.1_1.3b_rmd.yaml": ["method.chunk_teacher=''"],
           "wan2.1_1.3b_stream_r1.yaml": ["method.axes={visual: 'flowrl.distill.toy_rewards:colorfulness'}",
                                          "method.axis_kwargs={}"]}
    for recipe, extra in own.items():
        cfg = load_config(str(REPO / "configs/distill" / recipe),
                          paths + small + extra + [f"run.output_dir={tmp_path}", f"run.name={recipe}"])
        tr = DistillTrainer(cfg)
        assert isinstance(tr.roles.text_encoder, torch.nn.Module)
        assert tr.roles.vae.__class__.__name__ == "AutoencoderKLWan"
        metrics = tr.train_step(0)
        assert "loss/generator" in metrics and all(math.isfinite(v) for v in metrics.values()), (recipe, metrics)


def test_self_forcing_trains_from_a_wan22_ti2v_teacher(tmp_path):
    """A Wan2.2-TI2V-5B checkpoint dir (one transformer, 48 latent channels, the ×16 Wan2.2 VAE) is a streaming
    teacher as it is: teacher, student, critic, UMT5 and VAE load from it, and one DMD step trains."""
    from flowrl.distill.config import load_config
    from flowrl.distill.trainer import DistillTrainer
    from flowrl.policies.wan22 import Wan22TI2VPolicy

    ckpt = Wan22TI2VPolicy.tiny().save_pretrained(tmp_path / "ti2v")
    paths = [f"model.{k}={ckpt}" for k in ("teacher", "student_init", "critic_init", "text_encoder", "vae")]
    prompts = REPO / "configs/distill/tiny_prompts.txt"
    small = ["rollout.num_frames=4", "rollout.height=2", "rollout.width=2", "model.text_len=16",
             "model.dtype=float32", 'run.mixed_precision="no"', f"data.train={prompts}", f"data.eval={prompts}",
             "checkpoint.every=100", "model.chunk_frames=2", "model.window_frames=null", "model.sink_frames=0",
             f"run.output_dir={tmp_path}", "run.name=ti2v"]
    tr = DistillTrainer(load_config(str(REPO / "configs/distill/wan2.1_1.3b_self_forcing.yaml"), paths + small))
    assert tr.roles.teacher.transformer.config.in_channels == 48 and tr.roles.vae.config.z_dim == 48
    before = [p.detach().clone() for p in tr.roles.student.parameters()]
    metrics = tr.train_step(0)
    assert "loss/generator" in metrics and all(math.isfinite(v) for v in metrics.values()), metrics
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.roles.student.parameters(), strict=True))
