"""``scripts/bench.py video --quick``: video RL recipes train one tiny iteration through the learning lab and
the result carries the issue's keys (the distill part null with its reason), the JSON the last stdout line."""
import json
import math
import subprocess
import sys

import pytest

from flowrl.bench import available
from flowrl.bench.benchmarks import video
from flowrl.bench.paths import REPO

KEYS = ("video_rl_gain_mean", "video_rl_gain_se", "student_strict_ratio", "student_forward_ratio", "cache_ratio")


def test_video_bench_quick(tmp_path, monkeypatch):
    monkeypatch.delenv("FLOWRL_BENCH_RUN_CACHE", raising=False)
    assert "video" in available()
    out = tmp_path / "video.json"
    res = video.main(["--quick", "--methods", "grpo,nft", "--run-dir", str(tmp_path / "runs"), "--out", str(out),
                      "run.threads=1"])
    assert json.loads(out.read_text()) == res and all(k in res for k in KEYS)
    rl = res["rl"]
    assert set(rl["methods"]) == {"grpo", "nft"} and rl["equal_nfes"]   # dancegrpo: in test_unread_fields
    for m in rl["methods"].values():
        assert m["rollout_nfe"] == 2 * 2 * 3               # 2 prompts × 2 clips × 3 steps, one forward each
        assert 0 <= m["strict_after_mean"] <= 1 and 0 <= m["partial_before"] <= 1
        assert set(m["checks"]) == set(video.CHECKS) and m["palette_before"] > 0
        assert math.isfinite(m["strict_gain_mean"]) and m["per_seed"][0]["seed"] == 0
    assert res["video_rl_gain_mean"] == rl["methods"][rl["video_rl_best"]]["strict_gain_mean"]
    assert res["cache_ratio"] is None and "VAE" in res["distill"]["distill_reason"]
    assert len(res["table"]) == 2 + 2
    for name in rl["methods"]:                             # each run's evaluation wrote video grids
        assert (tmp_path / "runs" / f"{name}_s0" / "eval" / "after" / "grid_000.mp4").is_file()


def test_video_bench_refuses_unknown_parts_and_methods():
    """The first refusal through the CLI (scripts/bench.py, a fresh process); the second through the same main()
    in-process: a SystemExit with a message exits 1 and prints that message as stderr's last line."""
    proc = subprocess.run([sys.executable, "scripts/bench.py", "video", "--quick", "--parts", "rl,vbench"], cwd=REPO,
                          capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"})
    assert proc.returncode != 0 and "vbench" in proc.stderr.strip().splitlines()[-1]
    with pytest.raises(SystemExit) as e:
        video.main(["--quick", "--methods", "ppo", "--parts", "rl"])
    assert isinstance(e.value.code, str) and "ppo" in e.value.code.strip().splitlines()[-1]
