"""The memory planner (flowrl/planning, scripts/plan.py): counts equal the models', FSDP divides, the optimizer
formula equals torch's AdamW state, a typo'd key fails in the loader first; the validation against measured CPU
peaks is slow (``flowrl.bench.planner_measure``)."""
import importlib.util
from pathlib import Path

import pytest
import torch

from flowrl.config import load_config
from flowrl.planning import activations, budget, models

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def flat_activations(monkeypatch):
    """Bookkeeping tests: a constant activation coefficient instead of the measured probe."""
    k = activations.Coefficients(1.0, 1.0, 1.0, 1.0, 1.0, (1.0, 1.0, 1.0, 1.0), {})
    monkeypatch.setattr(activations, "coefficients", lambda *a, **kw: k)


@pytest.mark.parametrize("family", ["sd3", "flux", "wan", "wan22", "wan22_ti2v", "hunyuan15", "ltx2"])
def test_transformer_counts_equal_meta_instantiation(family):
    from flowrl.bench.benchmarks.gpu import build_transformer
    from flowrl.bench.benchmarks.gpu import load_config as published

    model = build_transformer(published(family), "meta", torch.bfloat16)
    c = models.count(family, None, False, None)
    assert c.transformer == sum(p.numel() for p in model.parameters())
    assert sum(c.blocks) < c.transformer and c.shard(1) == c.transformer


def test_wan22_holds_both_experts_and_trains_the_listed_ones(flat_activations):
    """A14B: two experts' weights resident; adapters, gradients and moments scale with train_experts."""
    recipe = REPO / "configs/wan22/grpo_t2v.yaml"
    lora = ["policy.lora={rank: 8, alpha: 16}"]
    one = budget.plan(load_config(recipe, lora), 8, 80, remedies=False)
    both = budget.plan(load_config(recipe, [*lora, "policy.train_experts=[transformer, transformer_2]"]), 8, 80,
                       remedies=False)
    c = models.count("wan22", None, False, None)
    bf16_weights = (c.transformer - c.fp32_params) * 2 + c.fp32_params * 4
    assert one.items["transformer weights (2 experts)"] == pytest.approx(2 * bf16_weights, rel=1e-6)
    for item in ("LoRA adapters (train, old)", "gradients", "AdamW moments (2×)"):
        assert both.items[item] == pytest.approx(2 * one.items[item], rel=1e-6), item
    assert both.phases["train activations"] == one.phases["train activations"]     # one expert runs per step


def test_lora_counts_equal_the_adapters_on_a_tiny_model():
    from flowrl.policies.lora import SD3_TARGETS, LoraConfig
    from flowrl.policies.toy import ToyPolicy

    lora = LoraConfig(rank=3, alpha=6, target_modules=SD3_TARGETS)
    policy = ToyPolicy.tiny(config=ToyPolicy.config_class(lora=lora))
    c = models.count("toy", None, True, lora)
    assert c.lora == sum(p.numel() for p in policy.trainable_parameters())
    assert c.lora == sum(p.numel() for p in policy.adapter_parameters("old"))
    assert c.transformer == sum(p.numel() for p in policy.transformer.parameters()) - 2 * c.lora


def test_fsdp_divides_the_transformer_items_by_n(flat_activations):
    cfg = load_config(REPO / "configs/sd35/grpo_pickscore.yaml", ["dist.fsdp=true"])
    one, eight = budget.plan(cfg, 1, 80, remedies=False), budget.plan(cfg, 8, 80, remedies=False)
    assert eight.sharded and not one.sharded
    for item in ("transformer weights", "LoRA adapters (train, old)", "AdamW moments (2×)", "EMA (float32)"):
        assert eight.items[item] == pytest.approx(one.items[item] / 8, rel=0.01), item
    assert eight.items["text encoders"] == one.items["text encoders"]           # not sharded
    assert eight.items["gradients"] == one.items["gradients"]                   # reduce_per_step: unsharded
    off = budget.plan(load_config(REPO / "configs/sd35/grpo_pickscore.yaml", ["dist.fsdp=true",
                      "dist.reduce_per_step=false"]), 8, 80, remedies=False)
    assert off.items["gradients"] == pytest.approx(one.items["gradients"] / 8, rel=0.01)


def test_adamw_bytes_equal_torch_state_after_one_step(flat_activations):
    from flowrl.policies.toy import ToyPolicy

    cfg = load_config(None, ["policy.tiny=true", "policy.lora={rank: 2, alpha: 4}", "sampler.height=32",
                             "sampler.width=32", "train.ema_decay=0.9"])
    policy = ToyPolicy.tiny(config=cfg.policy.config)
    params = policy.trainable_parameters()
    opt = torch.optim.AdamW(params)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    moments = sum(s[k].numel() * s[k].element_size() for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))
    p = budget.plan(cfg, 1, 80, remedies=False)
    assert p.items["AdamW moments (2×)"] == moments
    assert p.items["gradients"] == p.items["EMA (float32)"] == moments // 2


def test_a_typo_is_the_loaders_one_line_error_before_anything_is_built(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("plan_script", REPO / "scripts" / "plan.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(models, "count", lambda *a: pytest.fail("a model was instantiated"))
    with pytest.raises(SystemExit) as e:
        script.main(["--config", str(REPO / "configs/toy/grpo.yaml"), "train.micro_bach=2"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1
    assert err.startswith("config error:") and "micro_batch" in err


def test_verdict_names_a_remedy_when_it_does_not_fit(flat_activations):
    cfg = load_config(REPO / "configs/sd35/grpo_pickscore.yaml")
    p = budget.plan(cfg, 8, 12.0)
    assert not p.fits and p.remedies
    from flowrl.planning.report import verdict

    assert "DOES NOT FIT" in verdict(p) and "dist.fsdp=true" in verdict(p)


@pytest.mark.slow
def test_planner_within_20_percent_of_measured_cpu_peaks():
    from flowrl.bench.planner_measure import measure

    result = measure(quick=False)
    assert result["planner_max_rel_error"] < 0.2, result
