"""LoRA named adapters ("train", "old", base) and the full fine-tune fallback, on a small attention-like MLP."""
import pytest
import torch
from torch import nn

from flowrl.bench.benchmarks.adapters import peft_switch
from flowrl.policies import lora
from flowrl.policies.lora import LoraConfig
from flowrl.policies.weights import TransformerWeights


class Attn(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.to_q, self.to_k, self.to_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.to_out = nn.ModuleList([nn.Linear(d, d)])
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.to_out[0](self.to_q(x) * torch.sigmoid(self.to_k(x)) + self.to_v(self.norm(x)))


SMALL = LoraConfig(rank=4, alpha=8)


def make(lora_config=SMALL, keep_base=True, seed=0):
    torch.manual_seed(seed)
    return TransformerWeights(Attn(), lora_config, keep_base)


def run(w, x):
    return w.module()(x)


def grad_flags(w):
    names = w.names()
    return {n: [p.requires_grad for p in w.parameters(n)] for n in names if n is not None}


def perturb(params, scale, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(scale * torch.randn(p.shape, generator=g))


def test_fresh_adapters_equal_base_and_only_train_requires_grad():
    w, x = make(), torch.randn(3, 8)
    with w.use(None):
        base = run(w, x)
    for name in ("train", "old"):
        with w.use(name):
            torch.testing.assert_close(run(w, x), base, atol=0, rtol=0)
    flags = grad_flags(w)
    assert all(flags["train"]) and not any(flags["old"])
    assert not any(p.requires_grad for n, p in w.transformer.named_parameters() if "lora_" not in n)
    assert all(p.dtype == torch.float32 for p in w.trainable_parameters())


def test_changing_train_changes_only_train():
    w, x = make(), torch.randn(3, 8)
    before = {}
    for name in ("train", "old", None):
        with w.use(name):
            before[name] = run(w, x)
    perturb(w.parameters("train"), 0.1)
    with w.use("train"):
        assert (run(w, x) - before["train"]).abs().max() > 1e-3
    for name in ("old", None):
        with w.use(name):
            torch.testing.assert_close(run(w, x), before[name], atol=0, rtol=0)


@pytest.mark.parametrize("sequence", [["old"], [None], ["old", None, "train"], [None, "old"]])
def test_only_train_requires_grad_after_any_switch(sequence):
    w = make()
    for name in sequence:
        with w.use(name):
            flags = grad_flags(w)
            assert all(flags["train"]) and not any(flags["old"])
            assert lora.active_adapter(w.transformer) == name
    flags = grad_flags(w)
    assert all(flags["train"]) and not any(flags["old"])
    assert lora.active_adapter(w.transformer) == "train"


def test_context_restores_on_error():
    w = make()
    with pytest.raises(RuntimeError), w.use("old"):
        raise RuntimeError("boom")
    assert w.active == "train" and lora.active_adapter(w.transformer) == "train"


def test_unknown_adapter_is_a_clear_error():
    w = make()
    with pytest.raises(KeyError, match="choose one of"), w.use("ref"):
        pass


def test_soft_update_and_copy_closed_form():
    w = make()
    perturb(w.parameters("train"), 0.3, seed=2)
    perturb(w.parameters("old"), 0.3, seed=3)
    old0 = [p.detach().clone() for p in w.parameters("old")]
    train0 = [p.detach().clone() for p in w.parameters("train")]
    w.soft_update(0.9)
    for o, o0, t0 in zip(w.parameters("old"), old0, train0):
        torch.testing.assert_close(o, 0.9 * o0 + 0.1 * t0, atol=1e-7, rtol=1e-6)
    for t, t0 in zip(w.parameters("train"), train0):
        assert torch.equal(t, t0)
    w.copy("train", "old")
    assert all(torch.equal(o, t) for o, t in zip(w.parameters("old"), w.parameters("train")))
    with pytest.raises(ValueError, match="decay"):
        w.soft_update(1.5)


def test_save_load_adapter_exact(tmp_path):
    w = make()
    perturb(w.parameters("train"), 0.2)
    w.save(tmp_path / "a.safetensors", "train")
    other = make(seed=5)
    other.load(tmp_path / "a.safetensors", "old")
    for a, b in zip(w.parameters("train"), other.parameters("old")):
        assert torch.equal(a, b)
    state = w.state_dict("train")
    assert all(".lora_" in k and "flowrl_" not in k for k in state)
    wrong = make(LoraConfig(rank=2, alpha=4))
    with pytest.raises(ValueError, match="shape"):
        wrong.load(tmp_path / "a.safetensors", "train")


def test_base_state_dict_is_the_uninjected_model():
    torch.manual_seed(0)
    plain = Attn()
    w = make(seed=0)
    perturb(w.parameters("train"), 0.5)
    clean = w.base_state_dict()
    assert clean.keys() == plain.state_dict().keys()
    assert all(torch.equal(clean[k], v) for k, v in plain.state_dict().items())


def test_target_modules_that_match_nothing():
    with pytest.raises(ValueError, match="add_k_proj"):
        make(LoraConfig(target_modules=("add_k_proj",)))


def test_full_finetune_mode():
    w, x = make(lora_config=None), torch.randn(3, 8)
    assert w.trainable_parameters() == list(w.transformer.parameters())
    assert all(p.requires_grad for p in w.trainable_parameters())
    perturb(w.trainable_parameters(), 0.1)
    with w.use(None):
        base = run(w, x)
        assert not any(p.requires_grad for p in w.module().parameters())
    with w.use("old"):
        torch.testing.assert_close(run(w, x), base)
    assert (run(w, x) - base).abs().max() > 1e-3
    w.soft_update(0.5)
    with w.use("old"):
        assert (run(w, x) - base).abs().max() > 1e-4
    no_base = make(lora_config=None, keep_base=False)
    with pytest.raises(KeyError, match="keep_base"), no_base.use(None):
        pass


def test_forward_goes_through_a_wrapper_when_set():
    class Counting(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.calls = inner, 0

        def forward(self, x):
            self.calls += 1
            return self.inner(x)

    for cfg in (LoraConfig(rank=4, alpha=8), None):
        w = make(cfg)
        wrapper = Counting(w.transformer)
        w.forward_module = wrapper
        x = torch.randn(2, 8)
        for name in ("train", "old", None):
            with w.use(name):
                run(w, x)
        assert wrapper.calls == (3 if cfg is not None else 1)   # full FT: old/base are separate frozen copies


def _switch_state(model, x):
    layers = lora.tuner_layers(model)
    return ([(m.active_adapters, m.disable_adapters) for _, m in layers],
            [(n, p.requires_grad) for n, p in model.named_parameters()], model(x))


def test_activate_leaves_the_state_of_peft_own_switch_after_any_sequence():
    """``lora.activate`` skips the peft calls whose effect is already there; the state after any sequence of
    switches must be the one peft's own calls leave (``peft_switch``, the adapters benchmark's baseline)."""
    cfg = LoraConfig(rank=4, alpha=8, names=("train", "old", "ref"))
    fast, ref, x = make(cfg).transformer, make(cfg).transformer, torch.randn(3, 8)
    for model in (fast, ref):
        for i, n in enumerate(("train", "old", "ref")):
            perturb(lora.adapter_parameters(model, n), 0.1, seed=i)
    layers = lora.tuner_layers(fast)
    sequence = [("old", "train"), (None, "train"), ("train", "train"), ("train", "train"), (None, None),
                ("ref", "old"), ("ref", "train"), (None, "train"), ("old", None), ("train", "train")]
    for name, trainable in sequence:
        lora.activate(fast, name, trainable, layers=layers if name != "ref" else None)
        peft_switch(ref, name, trainable)
        (a_fast, g_fast, y_fast), (a_ref, g_ref, y_ref) = _switch_state(fast, x), _switch_state(ref, x)
        assert a_fast == a_ref and g_fast == g_ref, (name, trainable)
        torch.testing.assert_close(y_fast, y_ref, atol=0, rtol=0)
        wanted = {id(p) for p in lora.adapter_parameters(fast, trainable)} if trainable else set()
        assert {id(p) for p in fast.parameters() if p.requires_grad} == wanted, (name, trainable)


def test_asking_for_the_active_weights_switches_nothing(monkeypatch):
    w, calls = make(), []
    monkeypatch.setattr(lora, "activate", lambda *a, **k: calls.append(a[1]))
    with w.use("train"), w.use("train"):
        pass
    assert calls == []
    with w.use("old"), w.use("old"):
        pass
    assert calls == ["old", "train"]
    with pytest.raises(KeyError, match="choose one of"), w.use("nope"):
        pass
