"""The pretraining script: rectified-flow loss against its closed form, and a few real steps end to end."""
import importlib.util
from pathlib import Path

import torch

from flowrl.policies.toy import ToyPolicy

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_toy.py"


def _script():
    spec = importlib.util.spec_from_file_location("pretrain_toy", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _ZeroVelocity(torch.nn.Module):
    """Stands in for the transformer: v ≡ 0, so the loss is E‖ε − x0‖²."""

    def forward(self, hidden_states, **kw):
        return (torch.zeros_like(hidden_states),)


class _NoText(torch.nn.Module):
    def forward(self, input_ids):
        b = input_ids.shape[0]
        return type("Out", (), {"last_hidden_state": torch.zeros(b, 2, 4), "text_embeds": torch.zeros(b, 4)})


def test_rectified_flow_loss_closed_form():
    mod = _script()
    x0 = torch.rand(5, 3, 32, 32) * 2 - 1
    loss = mod.rectified_flow_loss(_ZeroVelocity(), _NoText(), torch.zeros(5, 3, dtype=torch.long), x0,
                                   torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    torch.sigmoid(torch.randn(5, generator=g))          # σ ~ logit-normal is drawn first
    eps = torch.randn(x0.shape, generator=g)
    assert torch.allclose(loss, (eps - x0).pow(2).mean())


def test_training_batch_is_reproducible_with_prompt_dropout():
    mod = _script()
    args = mod.parse_args(["--batch-size", "32", "--cfg-dropout", "0.5"])
    p1, x1 = mod.training_batch(4, args)
    p2, x2 = mod.training_batch(4, args)
    assert p1 == p2 and torch.equal(x1, x2) and x1.min() >= -1 and x1.max() <= 1
    assert 0 < p1.count("") < 32


def test_a_few_pretraining_steps_write_a_loadable_checkpoint(tmp_path):
    out = _script().main(["--preset", "tiny", "--steps", "3", "--batch-size", "4", "--out", str(tmp_path),
                          "--threads", "1"])
    assert out["steps"] == 3 and (tmp_path / "log.jsonl").is_file()
    pol = ToyPolicy.from_pretrained(tmp_path / "checkpoint")
    assert pol.transformer.config.num_layers == 1
    assert next(pol.transformer.parameters()).dtype == torch.float32  # fp16 on disk, loaded as asked
