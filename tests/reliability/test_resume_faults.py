"""Resume faults (issue #16 item 1), through scripts/train.py's main: a moved run resumes where it now is; a run
whose checkpoints are all damaged is refused with one line naming them (not retrained from scratch) unless
--restart; a damaged newest checkpoint falls back to an older one and still ends bitwise equal; a new run will
not overwrite another's checkpoints; two runs with one seed checkpoint the same python/numpy/torch RNG states."""
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from reliability_runs import adapter, same, tiny, train_script  # noqa: E402

from flowrl.checkpoint import list_checkpoints, load_checkpoint  # noqa: E402
from flowrl.config import ConfigError, load_config, load_resolved  # noqa: E402
from flowrl.training.trainer import Trainer  # noqa: E402


def cli(argv, capsys) -> tuple[int, str]:
    """(exit status, stderr) of ``scripts/train.py argv`` run in this process."""
    try:
        train_script().main([str(a) for a in argv])
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_moved_run_resumes_in_its_new_directory(tmp_path, capsys):
    assert cli(tiny(tmp_path / "old", "run", iterations=1), capsys)[0] == 0
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.move(tmp_path / "old" / "run", moved)
    code, err = cli(["--resume", moved, "train.iterations=2"], capsys)
    assert code == 0, err
    assert [s for s, _ in list_checkpoints(moved)] == [1, 2]
    assert not (tmp_path / "old" / "run").exists()                   # nothing was written at the old place
    cfg = load_config(moved / "config.yaml")                         # config.yaml follows the directory
    assert (Path(cfg.run.output_dir), cfg.run.name, cfg.train.iterations) == (moved.parent, "renamed", 2)
    assert not cfg.run.resume
    assert load_checkpoint(moved)[1]["loop"]["global_step"] == 4
    with pytest.raises(ConfigError, match=r"run\.name: cannot be overridden when resuming"):
        load_resolved(moved, ["run.name=other"])


def test_all_checkpoints_damaged_is_refused_until_restart(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli(tiny(tmp_path, iterations=2), capsys)[0] == 0
    for _, path in list_checkpoints(run_dir):
        (path / "manifest.json").unlink()
    before = (run_dir / "metrics.jsonl").read_text()
    code, err = cli(["--resume", run_dir], capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: cannot resume"), err
    assert "step_00000001: no manifest.json" in err and "step_00000002: no manifest.json" in err
    assert "--restart" in err
    assert (run_dir / "metrics.jsonl").read_text() == before          # nothing was retrained over the run
    code, err = cli(["--resume", run_dir, "--restart"], capsys)
    assert code == 0, err
    assert [s for s, _ in list_checkpoints(run_dir)] == [1, 2]
    assert [r["step"] for r in records(run_dir)] == [1, 2]            # the old run's records are gone


def test_a_damaged_newest_checkpoint_falls_back_to_an_older_one(tmp_path, capsys):
    full = Trainer(load_config(None, tiny(tmp_path, "full", iterations=3)))
    full.run()
    cut = tiny(tmp_path, "cut", iterations=2)
    Trainer(load_config(None, cut)).run()
    (tmp_path / "cut" / "checkpoints" / "step_00000002" / "manifest.json").write_text("{}")   # truncated
    resumed = Trainer(load_resolved(tmp_path / "cut", ["run.resume=true", "train.iterations=3"]))
    resumed.run()
    out = capsys.readouterr().out
    assert "passed over damaged checkpoints (step_00000002:" in out and "resumed from" in out
    assert resumed.state.iteration == 3 and resumed.state.global_step == full.state.global_step
    assert same(adapter(full), adapter(resumed))


def test_a_new_run_will_not_overwrite_another_runs_checkpoints(tmp_path, capsys):
    argv = tiny(tmp_path, iterations=1)
    assert cli(argv, capsys)[0] == 0
    code, err = cli(argv, capsys)
    assert code == 1 and "already holds checkpoints (step_00000001)" in err and "--resume" in err, err
    assert cli([*argv, "train.iterations=2", "--restart"], capsys)[0] == 0
    assert [r["step"] for r in records(tmp_path / "run")] == [1, 2]


def test_same_seed_gives_the_same_checkpointed_global_rng_state(tmp_path):
    def rng_of(name, seed):
        Trainer(load_config(None, tiny(tmp_path, name, iterations=1) + [f"run.seed={seed}"])).run()
        return load_checkpoint(tmp_path / name)[1]["rng"]

    a, b, c = rng_of("a", 3), rng_of("b", 3), rng_of("c", 4)
    assert a["python"] == b["python"] and a["numpy"]["key"].equal(b["numpy"]["key"])
    assert a["numpy"]["pos"] == b["numpy"]["pos"] and a["torch"].equal(b["torch"])
    assert a["python"] != c["python"] and not a["numpy"]["key"].equal(c["numpy"]["key"])
