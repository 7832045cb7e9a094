"""The memory planner on LTX-2 (flowrl/planning): the 19B transformer from configs/gpu counted on the meta device,
Gemma 3 12B + connectors as its text side, video + audio + text tokens and both latent streams in the stored samples
(closed forms of the recipe's geometry), one retained forward per guidance term, the tiny preset equal to the policy."""
from pathlib import Path

import pytest
import torch

from flowrl.config import load_config
from flowrl.planning import activations, budget, models

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs/ltx2/grpo_t2av.yaml"


@pytest.fixture
def flat_activations(monkeypatch):
    k = activations.Coefficients(1.0, 1.0, 1.0, 1.0, 1.0, (1.0, 1.0, 1.0, 1.0), {})
    monkeypatch.setattr(activations, "coefficients", lambda *a, **kw: k)


def test_published_counts_on_meta():
    import json

    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    cfg = json.loads((REPO / "configs/gpu/ltx2_transformer.json").read_text())
    model = models.build(cfg)
    c = models.count("ltx2", None, False, None)
    assert c.transformer == sum(p.numel() for p in model.parameters()) == 18_876_174_592
    assert len(c.blocks) == 48 and sum(c.blocks) < c.transformer
    text = models.GEMMA3_12B["text_config"]
    with torch.device("meta"):
        connectors = LTX2TextConnectors()
    # the Gemma width is what the transformer's caption projection reads; its layers + embeddings what the
    # connectors stack (text_proj_in_factor)
    assert text["hidden_size"] == cfg["caption_channels"] == connectors.config.caption_channels
    assert text["num_hidden_layers"] + 1 == connectors.config.text_proj_in_factor
    assert 12.0e9 < c.text["text_encoder"] < 12.4e9                     # Gemma 3 "12B" (model card)
    assert c.text["connectors"] == sum(p.numel() for p in connectors.parameters())


def test_recipe_plan_items_are_the_closed_forms(flat_activations):
    cfg = load_config(RECIPE)
    p = budget.plan(cfg, 8, 80, remedies=False)
    c = models.count("ltx2", None, False, cfg.policy.config.lora)
    video = ((121 - 1) // 8 + 1) * (512 // 32) * (768 // 32)                # F'·H'·W' = 16·16·24
    audio = round(121 / 24 * 16000 / 160 / 4)                              # 126 audio latents
    assert p.counts["tokens"] == video + audio + 1024
    assert p.items["text encoders"] == (c.text["text_encoder"] + c.text["connectors"]) * 2        # bf16
    assert p.items["VAE (float32)"] == c.vae * 4
    latent = 128 * video + 128 * audio
    cond = 1024 * (2 * 3840 + 1)
    local, states = cfg.samples_per_iter // 8, 3 * budget.stored_steps(cfg) + 1
    assert p.items["stored samples"] == local * (latent * 4 * states + cond * 2 + 3 * 121 * 512 * 768 * 4)
    assert p.counts["train_rows"] == p.counts["rollout_rows"] == 1          # every guidance term off in training


def test_each_guidance_term_is_a_retained_forward():
    cfg = load_config(RECIPE, ["policy.guidance=3.0", "policy.stg_scale=1.0", "policy.modality_scale=3.0"])
    assert budget.cfg_rows("ltx2", cfg, 3.0, True) == 4 and budget.cfg_rows("ltx2", cfg, 3.0, False) == 1
    only_audio = load_config(RECIPE, ["policy.audio_guidance=7.0"])
    assert budget.cfg_rows("ltx2", only_audio, 1.0, True) == 2              # audio CFG alone is a forward too


def test_tiny_counts_equal_the_policy_and_the_probe_runs():
    import json

    from flowrl.policies.lora import LoraConfig
    from flowrl.policies.ltx2 import Config, LTX2Policy

    lora = LoraConfig(rank=2, alpha=4, target_modules=("to_q", "to_v"))
    policy = LTX2Policy.tiny(config=Config(lora=lora, max_sequence_length=16))
    c = models.count("ltx2", None, True, lora)
    assert c.lora == sum(p.numel() for p in policy.trainable_parameters())
    assert c.transformer == sum(p.numel() for p in policy.transformer.parameters()) - 2 * c.lora
    parts = policy.pipe.components
    assert c.text == {k: sum(p.numel() for p in parts[k].parameters()) for k in ("text_encoder", "connectors")}
    assert c.vae == sum(p.numel() for k in ("vae", "audio_vae", "vocoder") for p in parts[k].parameters())
    k = activations.coefficients("ltx2", json.dumps(c.config, sort_keys=True), 2, 64, 16, 4)
    assert k.probe["tokens"] == 64 + 16 + 4
    assert min(k.block, k.block_ckpt, k.forward) > 0 and k.block_ckpt < k.block
