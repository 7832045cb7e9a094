"""Preemption and auto-resume (docs/training.md "On a cluster"): a signal mid-run stops after the iteration with a
checkpoint and a line saying how to resume; ``run.resume=auto`` continues it bitwise; a second signal during the
save exits at once and leaves the previous checkpoint loadable; bad values are one-line errors."""
import importlib.util
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import toy_overrides
from test_resume import assert_bitwise, final_state

from flowrl.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from flowrl.config import ConfigError, load_config
from flowrl.training.preemption import Preemption
from flowrl.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]


def base(tmp_path, iterations=3, every=0, objective="grpo"):
    return toy_overrides(tmp_path, objective, iterations=iterations) + ["eval.before=false", "eval.after=false",
                                                            f"checkpoint.every={every}"]


def signal_in(monkeypatch, at, sig=signal.SIGTERM):
    """The process signals itself during iteration ``at`` (before its rollout)."""
    original = Trainer.iteration

    def iteration(self, it):
        if it == at:
            os.kill(os.getpid(), sig)
        return original(self, it)

    monkeypatch.setattr(Trainer, "iteration", iteration)


def test_signal_stops_after_the_iteration_and_resume_auto_is_bitwise(tmp_path, monkeypatch, capsys):
    full = Trainer(load_config(None, base(tmp_path) + ["run.name=full"]))
    full.run()
    before = signal.getsignal(signal.SIGTERM)
    signal_in(monkeypatch, 1)
    cut = load_config(None, base(tmp_path) + ["run.name=cut", "run.resume=auto"])   # a new dir: starts fresh
    summary = Trainer(cut).run()
    assert summary["preempted"] == {"iteration": 2, "signal": "SIGTERM",
                                    "checkpoint": str(cut.run_dir / "checkpoints" / "step_00000002")}
    assert signal.getsignal(signal.SIGTERM) is before                                # handlers restored
    assert [s for s, _ in list_checkpoints(cut.run_dir)] == [2]      # checkpoint.every=0: the preemption's own
    assert (f"[flowrl] preempted at iteration 2: checkpoint {cut.run_dir}/checkpoints/step_00000002; resume "
            "with: rerun the same command (run.resume=auto)") in capsys.readouterr().out
    monkeypatch.undo()
    resumed = Trainer(cut)                                           # the same command again
    resumed.run()
    assert resumed.state.iteration == 3 and resumed.state.global_step == full.state.global_step
    assert_bitwise(final_state(full), final_state(resumed))


def train_script():
    spec = importlib.util.spec_from_file_location("flowrl_preempt_train_script", REPO / "scripts" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_script_exits_0_with_the_resume_line_and_resume_auto_continues(tmp_path, monkeypatch, capsys):
    main, args = train_script().main, base(tmp_path, iterations=2, objective="nft")   # on configs/default.yaml
    signal_in(monkeypatch, 0, signal.SIGUSR1)
    summary = main(args)                                     # returns: exit status 0 (no SystemExit)
    run_dir = tmp_path / "run"
    assert summary["preempted"]["iteration"] == 1 and summary["preempted"]["signal"] == "SIGUSR1"
    out = capsys.readouterr().out
    assert (f"[flowrl] preempted at iteration 1: checkpoint {run_dir}/checkpoints/step_00000001; resume with: "
            f"python scripts/train.py --resume {run_dir} (or rerun this command with run.resume=auto)") in out
    assert "held-out evaluation" not in out and "run directory:" not in out
    monkeypatch.undo()
    summary = main(["--resume", "auto", *args])
    assert summary["state"]["iteration"] == 2 and "preempted" not in summary
    assert f"resumed from {run_dir}/checkpoints/step_00000001 at iteration 1" in capsys.readouterr().out


def test_a_second_signal_during_the_save_exits_at_once_and_the_previous_checkpoint_resumes(tmp_path):
    """A forked child: SIGTERM in iteration 2 (stop after it, at 3), a second SIGTERM while the checkpoint of
    iteration 3 is being written: the child dies of SIGTERM, step_2 (checkpoint.every=2) loads and resumes."""
    args = base(tmp_path, iterations=4, every=2) + ["run.threads=1"]
    pid = os.fork()
    if pid == 0:                                             # the child never returns into pytest
        try:
            import flowrl.checkpoint.store as store

            save = store.torch.save

            def interrupted_save(obj, path, *a, **k):
                if "step_00000003" in str(path):
                    os.kill(os.getpid(), signal.SIGTERM)     # the second signal: dies here
                    time.sleep(30)
                save(obj, path, *a, **k)

            store.torch.save = interrupted_save
            trainer = Trainer(load_config(None, [*args, "run.name=cut"]))
            original = trainer.iteration

            def iteration(it):
                if it == 2:
                    os.kill(os.getpid(), signal.SIGTERM)     # the first signal: stop after this iteration
                return original(it)

            trainer.iteration = iteration
            trainer.run()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(3)
    deadline = time.monotonic() + 120
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child did not exit on the second signal")
    status = done[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
    run_dir = tmp_path / "cut"
    assert [s for s, _ in list_checkpoints(run_dir)] == [2]
    assert any(p.name.startswith(".tmp-step_00000003") for p in (run_dir / "checkpoints").iterdir())
    assert load_checkpoint(run_dir)[1]["loop"]["iteration"] == 2
    resumed = Trainer(load_config(None, [*args, "run.name=cut", "run.resume=auto"]))
    resumed.run()
    full = Trainer(load_config(None, [*args, "run.name=full"]))
    full.run()
    assert resumed.state.iteration == 4
    assert_bitwise(final_state(full), final_state(resumed))


def test_resume_auto_starts_fresh_beside_a_config_alone_and_refuses_damaged_checkpoints(tmp_path, capsys):
    args = base(tmp_path, iterations=1)
    Trainer(load_config(None, args)).open_run_dir()            # killed before its first save: config.yaml only
    run_dir = tmp_path / "run"
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "reward/total/mean": 0.5}\n')
    auto = Trainer(load_config(None, [*args, "run.resume=auto", "train.lr=1e-3"]))
    auto.open_run_dir()
    assert auto.state.iteration == 0
    out = capsys.readouterr().out
    assert f"no checkpoint in {run_dir}; starting from iteration 0" in out
    assert f"run.resume=auto: the config differs from {run_dir}/config.yaml in train.lr;" in out
    (run_dir / "checkpoints" / "step_00000001").mkdir(parents=True)       # damaged: no manifest
    with pytest.raises(CheckpointError, match="no checkpoint can be restored"):
        Trainer(load_config(None, [*args, "run.resume=auto"])).open_run_dir()


@pytest.mark.parametrize(("override", "message"), [
    ("run.resume=maybe", "run.resume: must be true, false or auto, got 'maybe'"),
    ("run.resume=1", "run.resume: must be true, false or auto, got 1"),
    ("run.preempt_signals=[SIGKILL]", "run.preempt_signals: 'SIGKILL' cannot ask for a clean stop; choose from "
                                      "SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP"),
    ("run.preempt_signals=SIGTERM", "run.preempt_signals: expected a list"),
])
def test_bad_values_are_one_line_errors_naming_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="resume and restart cannot both be set"):
        load_config(None, ["run.resume=auto", "run.restart=true"])


def test_signal_names_and_an_empty_list():
    assert load_config(None, ["run.preempt_signals=[usr1, SIGTERM, TERM]"]).run.preempt_signals == \
        ["SIGUSR1", "SIGTERM"]
    before = signal.getsignal(signal.SIGTERM)
    with Preemption([]):
        assert signal.getsignal(signal.SIGTERM) is before              # []: signals left alone
    with Preemption(["SIGUSR2"]) as p:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert p.received == "SIGUSR2"
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
