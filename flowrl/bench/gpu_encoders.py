"""Tiny random text encoders and VAEs with the real widths and latent factors, for ``scripts/bench.py gpu``.

Only the transformer matters for throughput there: these stand in for the families' encoders (CLIP 768/1280
pooled, T5 / UMT5, Qwen2.5-VL + ByT5) and VAEs (×8 space; Wan ×4 time; HunyuanVideo-1.5 ×16 space, 32 channels).
"""
from __future__ import annotations

VAE_SCALING = {"sd3": (1.5305, 0.0609), "flux": (0.3611, 0.1159)}   # (scaling_factor, shift_factor)


def clip_encoder(width: int, projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(vocab_size=1000, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=1,
                         num_attention_heads=4, projection_dim=width, bos_token_id=0, eos_token_id=2, pad_token_id=1,
                         max_position_embeddings=77, hidden_act="gelu")
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg)


def t5_encoder(width: int, umt5: bool = False):
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kw = {"d_model": width, "d_kv": 16, "num_heads": 4, "d_ff": 64, "num_layers": 1, "num_decoder_layers": 1,
          "relative_attention_num_buckets": 8, "vocab_size": 1103, "pad_token_id": 0, "eos_token_id": 1,
          "decoder_start_token_id": 0}
    return UMT5EncoderModel(UMT5Config(**kw)) if umt5 else T5EncoderModel(T5Config(**kw))


def family_vae(family: str):
    from diffusers import AutoencoderKL, AutoencoderKLHunyuanVideo15

    if family == "hunyuan15":       # ×16 space, ×4 time, 32 channels (the real factors), 8 wide
        return AutoencoderKLHunyuanVideo15(latent_channels=32, block_out_channels=(8,) * 5, layers_per_block=1)
    if family == "qwen_image":     # the Qwen-Image VAE's layout (16 channels, ×8 space) at width 8
        from diffusers import AutoencoderKLQwenImage

        return AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                                      temperal_downsample=[False, True, True])
    if family in ("wan", "wan22"):
        from flowrl.distill.components import tiny_vae

        return tiny_vae(0)
    scale, shift = VAE_SCALING[family]
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                         up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8,) * 4, layers_per_block=1,
                         latent_channels=16, norm_num_groups=8, use_quant_conv=False, use_post_quant_conv=False,
                         scaling_factor=scale, shift_factor=shift)


def hunyuan_text(c) -> dict:
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    from flowrl.policies.tiny import chatml_tokenizer

    tok = chatml_tokenizer()
    heads = 4
    q = c.text_embed_dim // heads // 2                      # M-RoPE sections split half the head width
    sections = [q // 4, (q - q // 4) // 2, q - q // 4 - (q - q // 4) // 2]
    qwen = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
        vocab_size=len(tok), hidden_size=c.text_embed_dim, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=heads, rope_theta=1000000.0,
        rope_scaling={"mrope_section": sections, "rope_type": "default", "type": "default"}))
    return {"text_encoder": qwen, "tokenizer": tok, "text_encoder_2": t5_encoder(c.text_embed_2_dim),
            "tokenizer_2": ByT5Tokenizer(), "guider": ClassifierFreeGuidance(guidance_scale=6.0)}
