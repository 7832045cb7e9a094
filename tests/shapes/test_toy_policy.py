"""ToyPolicy: tokenizer/text encoder, velocity and CFG vs direct calls, ODE sampling vs diffusers' scheduler,
LoRA adapters, save/load, and the shipped checkpoint."""
import pytest
import torch

from flowrl.policies import toy_modules as tm
from flowrl.policies.base import Policy
from flowrl.policies.toy import ToyPolicy


@pytest.fixture(scope="module")
def tiny():
    return ToyPolicy.tiny(seed=0)


def _gens(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def test_tokenizer_is_word_level_with_bos_eos_padding():
    tok = tm.build_tokenizer()
    vocab = tok.get_vocab()
    ids = tm.tokenize(tok, ["Two red circles", "", "a zebra"])
    assert ids.shape == (3, tm.MAX_TOKENS)
    assert ids[0, :5].tolist() == [1, vocab["two"], vocab["red"], vocab["circles"], 3] and ids[0, 5:].eq(0).all()
    assert ids[1, :2].tolist() == [1, 3]
    assert ids[2, 2].item() == tm.SPECIAL_TOKENS["<unk>"]


def test_pooled_embedding_is_the_projected_eos_state(tiny):
    ids = tm.tokenize(tiny.tokenizer, ["a blue square on the left"])
    hidden, pooled = tm.encode_text(tiny.text_encoder, ids)
    eos = (ids[0] == tm.SPECIAL_TOKENS["<eos>"]).nonzero()[0, 0]
    assert torch.allclose(pooled[0], tiny.text_encoder.text_projection(hidden[0, eos]), atol=1e-6)


def test_satisfies_the_policy_protocol(tiny):
    assert isinstance(tiny, Policy) and tiny.family == "toy"
    assert tiny.latent_shape(32, 32) == (3, 32, 32)
    with pytest.raises(ValueError, match="32×32"):
        tiny.latent_shape(64, 64)
    px = torch.rand(2, 3, 32, 32)
    assert torch.allclose(tiny.decode(tiny.encode_pixels(px)), px, atol=1e-6)


def test_velocity_and_cfg_match_direct_transformer_calls(tiny):
    cond = tiny.encode(["two red circles", "a blue square"])
    x = tiny.noise(_gens(2), 32, 32)
    sigma = torch.tensor([0.3, 0.8])

    def direct(embeds):
        return tm.predict_velocity(tiny.transformer, x, sigma, embeds["prompt_embeds"],
                                   embeds["pooled_prompt_embeds"])

    with torch.no_grad():
        v_c, v_u = direct(cond.embeds), direct(cond.uncond)
        assert torch.allclose(tiny.velocity(x, sigma, cond, guidance=1.0), v_c, atol=1e-5)
        assert torch.allclose(tiny.velocity(x, sigma, cond, guidance=3.0), v_u + 3.0 * (v_c - v_u), atol=1e-5)


def test_ode_rollout_matches_diffusers_scheduler_loop(tiny):
    from diffusers import FlowMatchEulerDiscreteScheduler

    from samplers.rollout import rollout

    cond = tiny.encode(["a green triangle", "three yellow squares"], cfg=False)
    x1 = tiny.noise(_gens(2), 32, 32)
    with torch.no_grad():
        ours = rollout(lambda x, s: tiny.velocity(x, s, cond), x1, tiny.sigmas(6, x1)).latents
        sched = FlowMatchEulerDiscreteScheduler(shift=1.0)
        sched.set_timesteps(6)
        x = x1.clone()
        for t in sched.timesteps:
            v = tiny.velocity(x, (t / 1000).expand(2), cond)
            x = sched.step(v, t, x).prev_sample
    assert torch.allclose(ours, x, atol=1e-5)


def test_lora_adapters_switch_without_copies_and_train_alone(tiny):
    cond = tiny.encode(["a red circle"], cfg=False)
    x = tiny.noise(_gens(1), 32, 32)
    s = torch.tensor([0.5])
    train = tiny.adapter_parameters("train")
    assert train and all(p.requires_grad for p in tiny.trainable_parameters())
    assert all(not p.requires_grad for n, p in tiny.transformer.named_parameters() if "lora" not in n)
    with torch.no_grad():
        base = tiny.velocity(x, s, cond)   # fresh adapters (B = 0) equal the base
        for p in train:
            p.add_(0.05 * torch.randn_like(p))
    with tiny.adapter(None), torch.no_grad():
        assert torch.allclose(tiny.velocity(x, s, cond), base, atol=1e-6)
    with tiny.adapter("old"), torch.no_grad():
        assert torch.allclose(tiny.velocity(x, s, cond), base, atol=1e-6)
    with tiny.adapter("train"):
        v = tiny.velocity(x, s, cond)
        assert not torch.allclose(v, base, atol=1e-4)
        v.pow(2).mean().backward()
    assert all(p.grad is not None for p in train)
    assert all(p.grad is None for p in tiny.adapter_parameters("old"))
    tiny.copy_adapter("train", "old")
    with tiny.adapter("old"), torch.no_grad():
        assert torch.allclose(tiny.velocity(x, s, cond), v.detach(), atol=1e-6)


def test_save_and_load_round_trip_keeps_adapters(tiny, tmp_path):
    with torch.no_grad():
        for p in tiny.adapter_parameters("train"):
            p.add_(0.01)
    tiny.save_pretrained(tmp_path / "pol")
    again = ToyPolicy.from_pretrained(tmp_path / "pol")
    cond = tiny.encode(["a purple square at the bottom"], cfg=False)
    x = tiny.noise(_gens(1), 32, 32)
    for name in ("train", "old", None):
        with tiny.adapter(name), again.adapter(name), torch.no_grad():
            assert torch.allclose(tiny.velocity(x, 0.4, cond), again.velocity(x, 0.4, cond), atol=1e-6)


def test_shipped_checkpoint_loads_and_samples():
    from samplers.rollout import rollout

    d = tm.default_asset_dir()
    size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    assert size < 21e6, f"shipped toy checkpoint is {size / 1e6:.1f} MB"
    pol = ToyPolicy.from_pretrained()
    assert pol.transformer.config.patch_size == 8 and pol.device == torch.device("cpu")
    cond = pol.encode(["two red circles", "a blue square on the left"])
    x1 = pol.noise(_gens(2), 32, 32)
    with torch.no_grad():
        res = rollout(lambda x, s: pol.velocity(x, s, cond), x1, pol.sigmas(4, x1))
    px = pol.decode(res.latents)
    assert px.shape == (2, 3, 32, 32) and px.min() >= 0 and px.max() <= 1 and res.nfe == 4
