"""Tiny, offline components for SD3, FLUX and Wan: the same classes as the real models, built from config objects.

Sizes follow diffusers' own pipeline tests (``get_dummy_components`` of
``test_pipeline_stable_diffusion_3.py``, ``test_pipeline_flux.py``, ``test_wan.py``); the hub-only pieces are
replaced: T5/UMT5 encoders from ``T5Config``/``UMT5Config`` with d_model 32, and
tokenizers trained here with the ``tokenizers`` library on an in-memory corpus (no download).

CLIP-like tokenizer: specials ``<|startoftext|>, <|pad|>, <|endoftext|>, <|unk|>`` → ids 0/1/2/3, matching
``CLIPTextConfig(bos_token_id=0, pad_token_id=1, eos_token_id=2)``. (With eos id 2 transformers' CLIP pools the
argmax token id — the legacy rule — which is fine for tests but not a meaningful sentence embedding.)
T5-like tokenizer: ``<pad>, </s>, <unk>`` → 0/1/2, post-processor ``$A </s>``.
"""
from __future__ import annotations

import torch

CORPUS_WORDS = (
    "a an the one two three four five six of and with on in left right above below next to near photo "
    "painting picture video image red green blue yellow orange purple pink black white gray brown small big large "
    "circle square triangle star cross heart ring shape shapes cat dog bird horse car tree house person squirrel "
    "eating burger dance monkey walking running sitting standing negative blurry low quality bright dark sky "
    "beach city street forest river mountain sunset night day is are there"
)


def _corpus() -> list[str]:
    words = CORPUS_WORDS.split()
    return [" ".join(words[i:i + 8]) for i in range(len(words))] + words


def _train_bpe(specials: list[str], unk: str, vocab_size: int):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                           show_progress=False))
    return tok


def clip_tokenizer(vocab_size: int = 1000, model_max_length: int = 77):
    """CLIP-like BPE tokenizer (bos/pad/eos = 0/1/2), as a transformers fast tokenizer."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<|startoftext|>", "<|pad|>", "<|endoftext|>", "<|unk|>"]
    tok = _train_bpe(specials, "<|unk|>", vocab_size)
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", 0), ("<|endoftext|>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0], pad_token=specials[1],
                                   eos_token=specials[2], unk_token=specials[3], model_max_length=model_max_length)


def t5_tokenizer(vocab_size: int = 1000, model_max_length: int = 512):
    """T5-like BPE tokenizer (pad/eos/unk = 0/1/2, ``$A </s>``), as a transformers fast tokenizer."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    tok = _train_bpe(specials, "<unk>", vocab_size)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=model_max_length)


def clip_text_config():
    from transformers import CLIPTextConfig

    return CLIPTextConfig(bos_token_id=0, eos_token_id=2, hidden_size=32, intermediate_size=37, layer_norm_eps=1e-05,
                          num_attention_heads=4, num_hidden_layers=5, pad_token_id=1, vocab_size=1000,
                          hidden_act="gelu", projection_dim=32)


def t5_encoder(umt5: bool = False):
    """T5 (or UMT5) encoder with d_model 32 (diffusers' ``test_allegro.py`` config, d_model → 32)."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kw = {"d_ff": 37, "d_kv": 8, "d_model": 32, "num_decoder_layers": 2, "num_heads": 4, "num_layers": 2,
          "relative_attention_num_buckets": 8, "vocab_size": 1103, "pad_token_id": 0, "eos_token_id": 1,
          "decoder_start_token_id": 0}
    model = UMT5EncoderModel(UMT5Config(**kw)) if umt5 else T5EncoderModel(T5Config(**kw))
    return model.eval()


def sd3_components(seed: int = 0) -> dict:
    """StableDiffusion3Pipeline components (diffusers test sizes; latent 4 channels, VAE factor 1)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection

    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(sample_size=32, patch_size=1, in_channels=4, num_layers=1,
                                        attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
                                        joint_attention_dim=32, pooled_projection_dim=64, out_channels=4)
    torch.manual_seed(seed)
    text_encoder = CLIPTextModelWithProjection(clip_text_config())
    torch.manual_seed(seed + 1)
    text_encoder_2 = CLIPTextModelWithProjection(clip_text_config())
    torch.manual_seed(seed)
    text_encoder_3 = t5_encoder()
    torch.manual_seed(seed)
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
                        latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035)
    return {"transformer": transformer, "vae": vae, "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),
            "text_encoder": text_encoder.eval(), "text_encoder_2": text_encoder_2.eval(),
            "text_encoder_3": text_encoder_3, "tokenizer": clip_tokenizer(), "tokenizer_2": clip_tokenizer(),
            "tokenizer_3": t5_tokenizer()}


def flux_components(seed: int = 0) -> dict:
    """FluxPipeline components (diffusers test sizes, plus guidance_embeds=True like FLUX.1-dev)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextModel

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                         pooled_projection_dim=32, axes_dims_rope=[4, 4, 8], guidance_embeds=True)
    torch.manual_seed(seed)
    text_encoder = CLIPTextModel(clip_text_config())
    torch.manual_seed(seed)
    text_encoder_2 = t5_encoder()
    torch.manual_seed(seed)
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
                        latent_channels=1, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035)
    # FLUX.1-dev scheduler config: dynamic (resolution-dependent) shift
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    return {"transformer": transformer, "vae": vae, "scheduler": scheduler, "text_encoder": text_encoder.eval(),
            "text_encoder_2": text_encoder_2, "tokenizer": clip_tokenizer(), "tokenizer_2": t5_tokenizer()}


def wan_components(seed: int = 0) -> dict:
    """WanPipeline components (diffusers test sizes; UMT5 like the real Wan2.1; VAE factors 4 (time) / 8)."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanTransformer3DModel

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                                        in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32,
                                        num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                        rope_max_seq_len=32)
    torch.manual_seed(seed)
    text_encoder = t5_encoder(umt5=True)
    return {"transformer": transformer, "vae": vae, "scheduler": FlowMatchEulerDiscreteScheduler(shift=7.0),
            "text_encoder": text_encoder, "tokenizer": t5_tokenizer()}


def wan22_components(seed: int = 0, variant: str = "t2v-a14b") -> tuple[dict, dict]:
    """Wan2.2 pipeline components and pipeline flags (``boundary_ratio``, ``expand_timesteps``) for ``variant``:
    "t2v-a14b" (two experts, boundary 0.875), "i2v-a14b" (36 input channels, boundary 0.9), "ti2v-5b" (one
    transformer, a 48-channel VAE with patch 2 and ×16 space, latent stats of its own). Sizes: ``wan_components``."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    if variant not in ("t2v-a14b", "i2v-a14b", "ti2v-5b"):
        raise ValueError(f"Wan2.2 tiny variant {variant!r}: choose t2v-a14b, i2v-a14b or ti2v-5b")
    parts = wan_components(seed)
    z = 48 if variant == "ti2v-5b" else 16
    in_ch = {"t2v-a14b": 16, "i2v-a14b": 36, "ti2v-5b": 48}[variant]
    kw = {"patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 12, "in_channels": in_ch,
          "out_channels": z, "text_dim": 32, "freq_dim": 256, "ffn_dim": 32, "num_layers": 2, "cross_attn_norm": True,
          "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 32}
    torch.manual_seed(seed)
    parts["transformer"] = WanTransformer3DModel(**kw)
    if variant == "ti2v-5b":
        torch.manual_seed(seed)
        parts["vae"] = AutoencoderKLWan(base_dim=3, z_dim=48, in_channels=12, out_channels=12, is_residual=True,
                                        patch_size=2, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                        temperal_downsample=[False, True, True], scale_factor_spatial=16,
                                        latents_mean=[0.02 * i - 0.5 for i in range(48)],
                                        latents_std=[0.5 + 0.03 * i for i in range(48)])
        return parts, {"boundary_ratio": None, "expand_timesteps": True}
    torch.manual_seed(seed + 1)
    parts["transformer_2"] = WanTransformer3DModel(**kw)
    return parts, {"boundary_ratio": 0.875 if variant == "t2v-a14b" else 0.9, "expand_timesteps": False}


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chatml_tokenizer(vocab_size: int = 1000):
    """Qwen-like byte-level BPE (``<|endoftext|>`` pad, ``<|im_start|>``/``<|im_end|>``) with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                           show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=specials[0], eos_token=specials[2],
                                   chat_template=CHATML)


def hunyuan15_components(seed: int = 0) -> dict:
    """HunyuanVideo15Pipeline components (diffusers ``test_hunyuan_1_5.py`` sizes: VAE ×4 space, ×2 time, 4
    latent channels; Qwen2.5-VL text model 16 wide over a ChatML tokenizer; ByT5 tokenizer + T5 d_model 32)."""
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Transformer3DModel
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    tokenizer = chatml_tokenizer()
    torch.manual_seed(seed)
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
        num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16, text_embed_2_dim=32,
        image_embed_dim=12, rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v")
    torch.manual_seed(seed)
    vae = AutoencoderKLHunyuanVideo15(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 16),
                                      layers_per_block=1, spatial_compression_ratio=4, temporal_compression_ratio=2,
                                      downsample_match_channel=False, upsample_match_channel=False)
    torch.manual_seed(seed)
    text_encoder = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=16, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=2, rope_theta=1000000.0,
        rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"}))
    torch.manual_seed(seed)
    return {"transformer": transformer, "vae": vae, "scheduler": FlowMatchEulerDiscreteScheduler(shift=7.0),
            "text_encoder": text_encoder.eval(), "tokenizer": tokenizer, "text_encoder_2": t5_encoder(),
            "tokenizer_2": ByT5Tokenizer(), "guider": ClassifierFreeGuidance(guidance_scale=6.0)}


def save_preset(family: str, directory, seed: int = 0):
    """Write the tiny preset of ``family`` (sd3, flux, wan, flux2, flux2_klein, zimage, qwen_image[_edit[_plus]]) in
    the diffusers layout; load it back with ``POLICIES.get(family).from_pretrained(directory, dtype=torch.float32)``
    or ``XPipeline.from_pretrained``."""
    from flowrl.policies import POLICIES

    families = ("sd3", "flux", "wan", "flux2", "flux2_klein", "zimage", "qwen_image", "qwen_image_edit",
                "qwen_image_edit_plus")
    if family not in families:
        raise ValueError(f"tiny presets exist for {', '.join(repr(f) for f in families)}; got {family!r}")
    return POLICIES.get(family).tiny(seed=seed).save_pretrained(directory)
