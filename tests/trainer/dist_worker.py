"""Run by test_distributed.py (under torchrun or alone): a tiny toy NFT run; writes the train adapter."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import toy_overrides

from flowrl.config import load_config
from flowrl.training.trainer import Trainer

torch.set_num_threads(1)
out_dir, name = sys.argv[1], sys.argv[2]
cfg = load_config(None, toy_overrides(out_dir, "nft", name, 2) + [
    "train.micro_batch=1", "sampler.chunk=1", "run.cpu=true", "eval.before=false", "eval.after=false",
    "rewards={shapes: 1.0}"])
t = Trainer(cfg)
t.run()
torch.save(t.policy.adapter_state_dict("train"), Path(out_dir) / f"{name}_rank{t.dist.rank}.pt")
