"""The method registry and the config: unknown names and keys fail with the nearest valid one; the trainer builds
and updates only what each method's capabilities declare."""
from pathlib import Path

import pytest
import torch

from flowrl.config.convert import ConfigError
from flowrl.distill.config import load_config
from flowrl.distill.methods import DMD, METHODS
from flowrl.distill.trainer import DistillTrainer
from flowrl.registry import RegistryError

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs/distill/tiny.yaml")


def tiny(tmp_path, *extra):
    return load_config(TINY, [f"run.output_dir={tmp_path}", "log.progress=false", *extra])


def test_registry_names_and_unknown_method_suggests_nearest():
    assert METHODS.names() == ["dmd", "ode_init", "rmd", "stream_r1"]
    with pytest.raises(RegistryError, match="did you mean 'stream_r1'"):
        METHODS.get("stream_r2")
    with pytest.raises(ConfigError, match=r"method\.kind.*did you mean 'ode_init'"):
        load_config(TINY, ["method=ode_inti"])


def test_typo_keys_name_the_key_and_the_nearest_valid_one():
    with pytest.raises(ConfigError, match=r"train\.lr_generater.*did you mean 'lr_generator'"):
        load_config(TINY, ["train.lr_generater=1e-4"])
    with pytest.raises(ConfigError, match=r"method\.chunk_stage_iteration\b.*did you mean 'chunk_stage_iterations'"):
        load_config(str(REPO / "configs/distill/tiny_rmd.yaml"), ["method.chunk_stage_iteration=3"])
    with pytest.raises(ConfigError, match=r"run\.sed.*did you mean 'seed'"):
        load_config(TINY, ["run.sed=1"])
    with pytest.raises(ConfigError, match="takes no settings"):       # dmd's settings are the dmd section's
        load_config(TINY, ["method.replay=true"])


@pytest.mark.parametrize("kind", ["dmd", "stream_r1", "rmd", "ode_init"])
def test_capabilities_of_each_registered_method_drive_the_trainer(kind, tmp_path):
    ov = {"stream_r1": ["method.axes={v: 'flowrl.distill.toy_rewards:colorfulness'}", "method.axis_kwargs={}"],
          "rmd": ["method.chunk_stage_iterations=1", "method.first_chunk_weight=2.0"],
          "ode_init": ["method.teacher_steps=4"]}.get(kind, [])
    cfg = tiny(tmp_path, f"method={kind}", "train.critic_steps_per_generator=2", *ov)
    tr = DistillTrainer(cfg)
    m = tr.method
    assert type(m) is METHODS.get(kind) and m.config is cfg.method.config
    assert (tr.roles.critic is not None) == m.trains_critic == (tr.opt_c is not None)
    assert (tr.roles.first_critic is not None) == m.first_critic
    assert hasattr(m, "reward_fns") == m.needs_rewards
    steps = [tr.train_step(s) for s in range(2)]
    assert ("loss/critic" in steps[1]) == m.trains_critic
    assert ("loss/generator" in steps[1]) == (not m.trains_critic)       # ratio 2: step 1 is critic-only


def test_a_registered_method_without_critic_builds_none(tmp_path):
    """A plugin method declares no critic: no critic role, no critic optimiser, generator every step, and its
    checkpoint resumes."""
    calls = []

    class NoCritic(DMD):
        trains_critic = False

        def generator_loss(self, step, roles, inputs, batch, cfg, gen, timesteps):
            calls.append(step)
            loss = inputs.video.square().mean()
            return loss, {"loss/generator": loss}

    METHODS.register("test_no_critic", NoCritic)
    cfg = tiny(tmp_path, "method=test_no_critic", "train.critic_steps_per_generator=5")
    tr = DistillTrainer(cfg)
    assert tr.roles.critic is None and tr.opt_c is None and tr.c_params == []
    hist = tr.fit(3)
    assert calls == [0, 1, 2] and all("loss/critic" not in h for h in hist)
    again = DistillTrainer(cfg)
    assert again.resume() == 3
    for a, b in zip(again.roles.student.parameters(), tr.roles.student.parameters()):
        assert torch.equal(a, b)


def test_run_section_refuses_a_used_run_dir_unless_resume_or_restart(tmp_path):
    from flowrl.checkpoint.resume import CheckpointError

    tr = DistillTrainer(tiny(tmp_path, "train.critic_steps_per_generator=2"))
    assert tr.open_run_dir() == 0
    tr.fit(2)
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        DistillTrainer(tiny(tmp_path)).open_run_dir()
    assert DistillTrainer(tiny(tmp_path, "run.resume=true")).open_run_dir() == 2
    assert DistillTrainer(tiny(tmp_path, "run.restart=true")).open_run_dir() == 0
    assert not (tmp_path / "distill_tiny" / "checkpoints").exists() or \
        not list((tmp_path / "distill_tiny" / "checkpoints").glob("step_*"))


def test_draws_come_from_the_project_seed_derivation(tmp_path):
    from samplers.rng import derived_generator

    tr = DistillTrainer(tiny(tmp_path, "run.seed=7"))
    ref = derived_generator(7, 3, "critic/noise", 0, namespace="flowrl.distill")
    assert torch.equal(torch.randn(4, generator=tr.generator(3, "critic/noise")), torch.randn(4, generator=ref))
    ref = derived_generator(7, 3, "generator/exit", "shared", namespace="flowrl.distill")
    assert torch.equal(torch.randn(4, generator=tr.shared_generator(3, "generator/exit")),
                       torch.randn(4, generator=ref))
