"""scripts/train.py prints errors raised on purpose as one line and exits 1 (issue #16 item 1): config mistakes
(at load time, also with --print-config, and the ones found before the policy loads), damaged checkpoints,
launch errors; --debug shows the traceback; an error that is not ours (a bug) keeps its traceback."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from reliability_runs import tiny, train_script  # noqa: E402

from flowrl.checkpoint import CheckpointError  # noqa: E402
from flowrl.errors import ON_PURPOSE, FlowRLError, LaunchError, SkipLimitError, one_line  # noqa: E402


def cli(argv, capsys):
    try:
        train_script().main([str(a) for a in argv])
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


def test_errors_on_purpose_share_a_base():
    from flowrl.config import ConfigError
    from rewards import RewardError

    for cls in (ConfigError, CheckpointError, SkipLimitError, LaunchError):
        assert issubclass(cls, FlowRLError)
    assert issubclass(RewardError, ValueError) and issubclass(SkipLimitError, FloatingPointError)
    assert ON_PURPOSE == (FlowRLError, ValueError)
    assert one_line(ValueError("a\n   b\tc")) == "a b c"


def test_config_errors_are_one_line_also_with_print_config(tmp_path, capsys):
    for extra in ([], ["--print-config"]):
        code, err = cli([*tiny(tmp_path), "train.lr=-1", *extra], capsys)
        assert code == 1 and err == ["config error: train.lr: must be > 0, got -1.0 "
                                     "(in command-line override 'train.lr=-1')"]


def test_a_missing_resume_directory_is_one_line(tmp_path, capsys):
    code, err = cli(["--resume", tmp_path / "nothing"], capsys)
    assert code == 1 and len(err) == 1 and err[0].startswith("config error: cannot resume:")


def test_debug_shows_the_traceback(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli(tiny(tmp_path, iterations=1), capsys)[0] == 0
    (run_dir / "checkpoints" / "step_00000001" / "manifest.json").unlink()
    code, err = cli(["--resume", run_dir], capsys)
    assert code == 1 and len(err) == 1 and err[0].startswith("error: cannot resume")
    with pytest.raises(CheckpointError, match="no checkpoint can be restored"):
        train_script().main(["--resume", str(run_dir), "--debug"])


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    import flowrl.training.trainer as trainer

    def broken(cfg, accelerator=None, policy=None):
        raise KeyError("a bug, not a user mistake")

    monkeypatch.setattr(trainer, "train", broken)
    with pytest.raises(KeyError, match="a bug"):
        train_script().main(tiny(tmp_path))


def test_a_launch_without_a_process_group_is_refused(tmp_path, capsys, monkeypatch):
    """torchrun on a machine without GPUs and without run.cpu=true: each process would run the whole job into
    the same directory. Refused before anything is built (issue #16 item 4)."""
    import flowrl.distributed.processes as processes

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(processes, "accelerator_available", lambda: False)
    code, err = cli(tiny(tmp_path), capsys)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("error: 2 processes were launched (WORLD_SIZE=2) but no GPU is visible")
    assert "run.cpu=true" in err[0] and not (tmp_path / "run").exists()
    with pytest.raises(LaunchError, match="not a number"):
        monkeypatch.setenv("WORLD_SIZE", "two")
        processes.make_accelerator()
