"""Parameter counts of a run's models, from their configs instantiated on the meta device (no weights, no download).

Transformer: the published ``config.json`` in ``configs/gpu/`` for the family (SD3.5-Medium, FLUX.1-dev,
Wan2.1-T2V-1.3B, Wan2.2 T2V/I2V-A14B (one expert; ``EXPERTS`` counts the resident copies) and TI2V-5B,
HunyuanVideo-1.5 480p, LTX-2), a local checkpoint's ``transformer/config.json``, the toy's shipped config or the
tiny preset.
Derived sizes for the hub ids the recipes may name instead: Wan2.1-T2V-14B (40 heads × 128, FFN 13824, 40 layers)
and SD3.5-Large (38 layers, 38 heads, caption projection 2432, no dual attention), from their published configs.
Text encoders and VAE: the published architectures (CLIP-L/14, OpenCLIP bigG, T5-v1.1-XXL, UMT5-XXL encoders;
the SD3/FLUX AutoencoderKL, AutoencoderKLWan; LTX-2's Gemma 3 12B with its SigLIP tower, and the diffusers
constructor defaults of LTX2TextConnectors, both LTX-2 VAEs and the vocoder) built on the meta device; the toy's from
its shipped configs.
LoRA: r·(d_in + d_out) for every ``nn.Linear`` whose name matches a target as peft matches it (the name, or a
dotted suffix), per adapter.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = {"sd3": "sd35_medium_transformer.json", "flux": "flux1_dev_transformer.json",
             "wan": "wan21_t2v_1.3b_transformer.json", "wan22": "wan22_t2v_a14b_transformer.json",
             "wan22_i2v": "wan22_i2v_a14b_transformer.json", "wan22_ti2v": "wan22_ti2v_5b_transformer.json",
             "hunyuan15": "hunyuan15_480p_t2v_transformer.json", "ltx2": "ltx2_transformer.json"}
WAN = ("wan", "wan22", "wan22_i2v", "wan22_ti2v")
EXPERTS = {"wan22": 2, "wan22_i2v": 2}        # transformers resident (Wan2.2-A14B: high- and low-noise experts)
DERIVED = {("wan", "14b"): {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40},
           ("sd3", "large"): {"num_layers": 38, "num_attention_heads": 38, "caption_projection_dim": 2432,
                              "dual_attention_layers": [], "pos_embed_max_size": 192}}
BLOCKS = {"sd3": ("transformer_blocks",), "toy": ("transformer_blocks",), "wan": ("blocks",),
          "flux": ("transformer_blocks", "single_transformer_blocks"), "wan22": ("blocks",), "wan22_i2v": ("blocks",),
          "wan22_ti2v": ("blocks",), "hunyuan15": ("transformer_blocks",), "ltx2": ("transformer_blocks",)}
# Qwen2.5-VL-7B's text model (HunyuanVideo-1.5's MLLM encoder) and ByT5-small (its glyph encoder), published configs
QWEN25_VL_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                "num_key_value_heads": 4, "vocab_size": 152064}
BYT5_SMALL = {"d_model": 1472, "d_ff": 3584, "d_kv": 64, "num_heads": 6, "num_layers": 12, "vocab_size": 384,
              "feed_forward_proj": "gated-gelu"}
# Wan2.2-TI2V-5B's VAE (48 channels, ×16 space: residual blocks and a 2×2 patch), diffusers convert_wan_to_diffusers.py
WAN22_VAE = {"base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "is_residual": True, "in_channels": 12,
             "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16, "latents_mean": [0.0] * 48,
             "latents_std": [1.0] * 48}
# Gemma 3 12B (LTX-2's text encoder), google/gemma-3-12b-it config.json: text width 3840 = the transformer's
# caption_channels, 48 layers (+ the embeddings = the connectors' text_proj_in_factor 49); SigLIP-so400m tower
GEMMA3_12B = {"text_config": {"hidden_size": 3840, "intermediate_size": 15360, "num_hidden_layers": 48,
                              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
                              "vocab_size": 262208},
              "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                                "num_attention_heads": 16, "image_size": 896, "patch_size": 14},
              "mm_tokens_per_image": 256}
CLIP_L = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
          "projection_dim": 768, "vocab_size": 49408, "max_position_embeddings": 77}
CLIP_G = {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 20,
          "projection_dim": 1280, "vocab_size": 49408, "max_position_embeddings": 77, "hidden_act": "gelu"}
T5_XXL = {"d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "num_layers": 24, "vocab_size": 32128,
          "feed_forward_proj": "gated-gelu"}
VAE_PARTS = ("vae", "audio_vae", "vocoder")     # decoders kept in float32 (LTX-2: video, audio VAE and vocoder)
SD3_VAE = {"in_channels": 3, "out_channels": 3, "down_block_types": ("DownEncoderBlock2D",) * 4,
           "up_block_types": ("UpDecoderBlock2D",) * 4, "block_out_channels": (128, 256, 512, 512),
           "layers_per_block": 2, "latent_channels": 16, "use_quant_conv": False, "use_post_quant_conv": False}


@dataclass
class Counts:
    """Parameter counts of one run's models (elements; bytes are the budget's, which knows the dtypes)."""

    transformer: int                     # every transformer parameter (the base weights)
    fp32_params: int                     # of which kept in float32 (the class' _keep_in_fp32_modules)
    blocks: list[int]                    # per FSDP block unit
    dim0: list[tuple[int, int]]          # (dim-0 size, numel) per parameter: FSDP's per-process chunk
    lora: int                            # one adapter's parameters (0 in full fine-tune)
    text: dict[str, int] = field(default_factory=dict)      # text encoders by component name
    vae: int = 0
    config: dict = field(default_factory=dict)              # the transformer config used

    @property
    def root(self) -> int:
        """Parameters outside the blocks (embeddings, output layers): the transformer's own FSDP unit."""
        return self.transformer - sum(self.blocks)

    def shard(self, n: int) -> int:
        """Elements process 0 of ``n`` holds of the transformer: ⌈d0 / n⌉ · numel / d0 per parameter."""
        return sum(-(-d0 // n) * (numel // d0) for d0, numel in self.dim0) if n > 1 else self.transformer


def transformer_config(family: str, path: str | None, tiny: bool) -> dict:
    """The transformer config a run loads: local checkpoint, published (or derived) config, toy or tiny preset."""
    if family not in BLOCKS:
        raise ValueError(f"the memory planner does not model {family!r} yet (it knows {', '.join(sorted(BLOCKS))})")
    if tiny:
        tr = tiny_transformer(family)
        return {**dict(tr.config), "_class_name": type(tr).__name__}
    if family == "toy":
        local = Path(path) if path else REPO / "flowrl/assets/toy"
        return json.loads((local / "transformer" / "config.json").read_text())
    if path and (Path(path).expanduser() / "transformer" / "config.json").is_file():
        return json.loads((Path(path).expanduser() / "transformer" / "config.json").read_text())
    cfg = json.loads((REPO / "configs" / "gpu" / PUBLISHED[family]).read_text())
    for (fam, tag), change in DERIVED.items():
        if fam == family and tag in (path or "").lower():
            cfg.update(change)
    return cfg


def tiny_transformer(family: str, **changes) -> nn.Module:
    """The family's tiny preset transformer (``flowrl.policies.tiny`` / the toy's tiny preset), optionally rebuilt
    with config ``changes`` (e.g. another ``num_layers``)."""
    from flowrl.policies import toy_modules

    if family == "toy":
        tr = toy_modules.build_modules("tiny")[2]
    else:
        tr = tiny_components(family)["transformer"]
    return build({**dict(tr.config), "_class_name": type(tr).__name__}, "cpu", **changes) if changes else tr


def tiny_components(family: str) -> dict:
    """The family's tiny preset pipeline components (``flowrl.policies.tiny``)."""
    from flowrl.policies import tiny

    variants = {"wan22": "t2v-a14b", "wan22_i2v": "i2v-a14b", "wan22_ti2v": "ti2v-5b"}
    if family in variants:
        return tiny.wan22_components(0, variants[family])[0]
    if family == "ltx2":
        from flowrl.policies.tiny_ltx2 import ltx2_components

        return ltx2_components()
    return {"sd3": tiny.sd3_components, "flux": tiny.flux_components, "wan": tiny.wan_components,
            "hunyuan15": tiny.hunyuan15_components}[family]()


def build(cfg: dict, device: str = "meta", **changes) -> nn.Module:
    """``diffusers.<_class_name>.from_config(cfg | changes)`` on ``device`` (meta: shapes only)."""
    import diffusers

    cls = cfg.get("_class_name", "SD3Transformer2DModel")
    with torch.device(device):
        return getattr(diffusers, cls).from_config({k: v for k, v in {**cfg, **changes}.items() if k[0] != "_"})


def count(family: str, path: str | None, tiny: bool, lora) -> Counts:
    """Every count of ``Counts`` for a run's policy (``lora``: its LoraConfig or None)."""
    cfg = transformer_config(family, path, tiny)
    cfg.setdefault("_class_name", "SD3Transformer2DModel")
    total, fp32, blocks, dim0, linears = meta_stats(family, json.dumps(cfg, sort_keys=True))
    text, vae = encoder_counts(family, path, tiny)
    adapter = 0 if lora is None else sum(lora.rank * (i + o) for name, i, o in linears
                                         if any(name == t or name.endswith("." + t) for t in lora.target_modules))
    return Counts(transformer=total, fp32_params=fp32, blocks=list(blocks), dim0=list(dim0), lora=adapter,
                  text=dict(text), vae=vae, config=cfg)


@lru_cache(maxsize=None)
def meta_stats(family: str, cfg_json: str) -> tuple:
    """(parameters, float32-kept parameters, per-block parameters, (dim 0, numel) per parameter, (name, d_in,
    d_out) per ``nn.Linear``) of the transformer ``cfg_json`` instantiated on the meta device."""
    model = build(json.loads(cfg_json))
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    params = list(model.named_parameters())
    blocks = tuple(sum(p.numel() for p in b.parameters()) for attr in BLOCKS[family] for b in getattr(model, attr))
    linears = tuple((n, m.in_features, m.out_features) for n, m in model.named_modules() if isinstance(m, nn.Linear))
    return (sum(p.numel() for _, p in params), sum(p.numel() for n, p in params if keep & set(n.split("."))),
            blocks, tuple((p.shape[0], p.numel()) for _, p in params), linears)


def numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@lru_cache(maxsize=None)
def encoder_counts(family: str, path: str | None, tiny: bool) -> tuple[dict[str, int], int]:
    """({text encoder: parameters}, VAE parameters) resident next to the transformer."""
    if tiny:
        from flowrl.policies import toy_modules

        if family == "toy":
            return {"text_encoder": numel(toy_modules.build_modules("tiny")[1])}, 0
        comps = tiny_components(family)
        return ({k: numel(v) for k, v in comps.items() if k.startswith("text_encoder") or k == "connectors"},
                sum(numel(comps[k]) for k in VAE_PARTS if k in comps))
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTextModelWithProjection,
        T5Config,
        T5EncoderModel,
        UMT5Config,
        UMT5EncoderModel,
    )

    with torch.device("meta"):
        if family == "toy":
            te = Path(path) if path else REPO / "flowrl/assets/toy"
            conf = CLIPTextConfig.from_json_file(te / "text_encoder" / "config.json")
            return {"text_encoder": numel(CLIPTextModelWithProjection(conf))}, 0
        if family in WAN:
            from diffusers import AutoencoderKLWan

            umt5 = UMT5EncoderModel(UMT5Config(**{**T5_XXL, "vocab_size": 256384}))   # T5-XXL, the mT5 vocab
            vae = AutoencoderKLWan(**WAN22_VAE) if family == "wan22_ti2v" else AutoencoderKLWan()
            return {"text_encoder": numel(umt5)}, numel(vae)
        if family == "ltx2":
            return ltx2_encoder_counts()
        if family == "hunyuan15":
            from diffusers import AutoencoderKLHunyuanVideo15
            from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

            qwen = numel(Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**QWEN25_VL_7B)))
            return ({"text_encoder": qwen, "text_encoder_2": numel(T5EncoderModel(T5Config(**BYT5_SMALL)))},
                    numel(AutoencoderKLHunyuanVideo15()))
        from diffusers import AutoencoderKL

        t5 = numel(T5EncoderModel(T5Config(**T5_XXL)))
        vae = numel(AutoencoderKL(**SD3_VAE))
        if family == "flux":
            return {"text_encoder": numel(CLIPTextModel(CLIPTextConfig(**CLIP_L))), "text_encoder_2": t5}, vae
        return {"text_encoder": numel(CLIPTextModelWithProjection(CLIPTextConfig(**CLIP_L))),
                "text_encoder_2": numel(CLIPTextModelWithProjection(CLIPTextConfig(**CLIP_G))),
                "text_encoder_3": t5}, vae


def ltx2_encoder_counts() -> tuple[dict[str, int], int]:
    """({Gemma 3 12B, connectors}, video VAE + audio VAE + vocoder) of LTX-2, on the meta device."""
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    with torch.device("meta"):
        gemma = numel(Gemma3ForConditionalGeneration(Gemma3Config(**GEMMA3_12B)))
        return ({"text_encoder": gemma, "connectors": numel(LTX2TextConnectors())},
                numel(AutoencoderKLLTX2Video()) + numel(AutoencoderKLLTX2Audio()) + numel(LTX2Vocoder()))
