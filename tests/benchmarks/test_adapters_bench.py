"""The adapters benchmark's parts: the meta-device model carries the family's adapters, both switches leave
the same state on it, and the iteration count reads every ``use`` and every actual switch."""
import torch

from flowrl.bench.benchmarks import adapters
from flowrl.policies import lora


def test_both_switches_leave_the_same_state_on_the_meta_model():
    fast, ref = adapters.meta_model("sd3", quick=True), adapters.meta_model("sd3", quick=True)
    assert ref.transformer_blocks[0].attn.to_q.weight.is_meta
    assert lora.adapter_names(fast) == ["train", "old"] and lora.tuner_layers(fast)
    layers = lora.tuner_layers(fast)
    for name in ("old", None, "train", "train", None, "old"):
        lora.activate(fast, name, layers=layers)
        adapters.peft_switch(ref, name)
        state = [[(m.active_adapters, m.disable_adapters) for _, m in lora.tuner_layers(w)]
                 + [(n, p.requires_grad) for n, p in w.named_parameters()] for w in (fast, ref)]
        assert state[0] == state[1], name


def test_one_grpo_iteration_switches_only_where_the_weights_change(tmp_path):
    torch.manual_seed(0)
    count = adapters.iteration_switches(str(tmp_path))
    uses = count["uses"]
    assert count["beta_kl"] > 0 and uses["train->None"] > 0 and uses["train->old"] > 0
    assert count["before"] == 2 * sum(uses.values())
    assert count["after"] == 2 * sum(n for k, n in uses.items() if k.split("->")[0] != k.split("->")[1])
