"""The pieces of the FSDP path that need no process group: which modules each policy family shards, when a run
is sharded (dist.fsdp, accelerate's FSDP config, one process), the mixed-precision policies, and the launches
and settings that are refused with one line."""
from types import SimpleNamespace

import pytest
import torch

from flowrl.config import load_config
from flowrl.config.convert import ConfigError
from flowrl.distributed import fsdp
from flowrl.distributed.processes import Dist, make_accelerator
from flowrl.errors import LaunchError


def fake_accelerator(kind: str = "MULTI_CPU", world: int = 2):
    def refuse(*args, **kwargs):
        raise AssertionError("no collective expected")

    return SimpleNamespace(process_index=0, num_processes=world, device=torch.device("cpu"),
                           distributed_type=SimpleNamespace(name=kind), reduce=refuse)


def test_shard_units_are_each_familys_blocks():
    from flowrl.policies.flux import FluxPolicy
    from flowrl.policies.lora import LoraConfig
    from flowrl.policies.toy import Config as ToyConfig
    from flowrl.policies.toy import ToyPolicy
    from flowrl.policies.wan import WanPolicy

    flux = FluxPolicy.tiny()
    (module, blocks), = flux.shard_units()
    assert module is flux.transformer
    assert blocks == [*flux.transformer.transformer_blocks, *flux.transformer.single_transformer_blocks]
    wan = WanPolicy.tiny()
    assert wan.shard_units()[0][1] == list(wan.transformer.blocks)
    lora = ToyPolicy.tiny(config=ToyConfig(lora=LoraConfig(rank=2, alpha=4)))
    (module, blocks), = lora.shard_units()
    assert blocks == list(lora.transformer.transformer_blocks)
    full = ToyPolicy.tiny(config=ToyConfig(lora=None))          # "old" and the base are frozen copies
    units = full.shard_units()
    assert len(units) == 3 and units[0][0] is full.transformer
    assert len({id(m) for m, _ in units}) == 3 and all(len(b) == len(units[0][1]) for _, b in units)


def test_a_run_is_sharded_by_dist_fsdp_or_accelerates_fsdp_config(monkeypatch, capsys):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert not Dist(fake_accelerator()).sharded
    assert Dist(fake_accelerator(), fsdp=True).sharded
    assert Dist(fake_accelerator("FSDP")).sharded                 # accelerate launch with an FSDP config
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")             # what accelerate launch sets for it
    assert Dist(fake_accelerator()).sharded
    one = Dist(fake_accelerator(world=1), fsdp=True)               # nothing to shard on one process
    assert not one.sharded and "one process, nothing to shard" in capsys.readouterr().out


def test_sharded_gradients_are_not_averaged_again():
    """FSDP's backward leaves the process-mean gradient; ``average_gradients`` must not touch it (the fake
    accelerator's reduce raises if called)."""
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    Dist(fake_accelerator(), fsdp=True).average_gradients([p])
    assert torch.equal(p.grad, torch.full((3,), 2.0))


def test_gradients_are_reduced_in_the_steps_last_pass_or_every_pass():
    calls = []
    module = SimpleNamespace(set_requires_gradient_sync=calls.append)
    per_step, each = fsdp.Sharding(module, None, True), fsdp.Sharding(module, None, False)
    for last in (False, True):
        per_step.gradient_sync(last)
        each.gradient_sync(last)
    assert calls == [False, True, True, True]


def test_mixed_precision_policies():
    block, root = fsdp.mixed_precision_policies("no", torch.float32)
    assert block.param_dtype is None and block.reduce_dtype is None and root.param_dtype is None
    block, root = fsdp.mixed_precision_policies("bf16", torch.float32)
    assert (block.param_dtype, block.reduce_dtype, block.output_dtype) == (torch.bfloat16, torch.float32,
                                                                           torch.float32)
    assert root.param_dtype is None and root.reduce_dtype == torch.float32 and not root.cast_forward_inputs
    block, _ = fsdp.mixed_precision_policies("fp16", torch.float16)
    assert block.param_dtype == torch.float16 and block.output_dtype is None
    with pytest.raises(ValueError, match="run.mixed_precision"):
        fsdp.mixed_precision_policies("fp8", torch.float32)


def test_plain_tensors_pass_through_the_full_state_helpers():
    t = torch.arange(4.0)
    assert fsdp.full_tensors({"a": t})["a"].data_ptr() == t.data_ptr()        # no copy on the CPU
    assert fsdp.full_tensors({"a": t}, keep=False) == {}
    assert fsdp.shard_like(t, torch.zeros(4)) is t
    assert fsdp.local_bytes([t, torch.zeros(2, dtype=torch.bfloat16)]) == 4 * 4 + 2 * 2


def test_the_fp4_scout_is_refused_under_fsdp():
    cfg = load_config("configs/toy/pools/pool_nft.yaml", ["sampler.pool.scout={kind: fp4}"])
    with pytest.raises(ConfigError, match="sampler.pool.scout: the fp4 scout cannot run with dist.fsdp"):
        fsdp.check_shardable(cfg)
    fsdp.check_shardable(load_config("configs/toy/pools/pool_nft.yaml"))           # x0_exit runs sharded


def test_a_deepspeed_launch_is_refused(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(LaunchError, match="does not run DeepSpeed"):
        make_accelerator("no", cpu=True)
