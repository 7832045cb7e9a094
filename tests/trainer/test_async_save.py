"""``checkpoint.async_save`` is a sharded run's setting: an unsharded run refuses it in one line, before it trains
(the two-process asynchronous case is in test_fsdp_dcp.py)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import toy_overrides  # noqa: E402

from flowrl.config import ConfigError, load_config  # noqa: E402
from flowrl.training.trainer import Trainer  # noqa: E402


def test_an_unsharded_run_refuses_asynchronous_saves(tmp_path):
    cfg = load_config(None, toy_overrides(tmp_path, "nft") + ["checkpoint.async_save=true"])
    with pytest.raises(ConfigError, match="checkpoint.async_save: asynchronous saves write the shards"):
        Trainer(cfg)
