"""Tiny, offline LTX-2 components (``LTX2Pipeline``): the same classes as the real model, built from config objects.

Transformer, connectors, video / audio VAEs and vocoder take the sizes of diffusers' ``tests/pipelines/ltx2/
test_ltx2.py`` (``get_dummy_components``); the hub-only text side is replaced by a ``Gemma3ForConditionalGeneration``
built from a ``Gemma3Config`` whose text hidden size (32) is the connectors' heads × head dim (4 × 8), with a tiny
SigLIP vision tower, over the T5-like BPE tokenizer of ``tiny.py`` (no download). The video VAE compresses ×2 in
space and time, so 32×32×5 frames → latents (4, 3, 16, 16); the audio latents are 2 channels × 2 mel bins. The video
VAE's latent statistics are set away from 0 / 1 so the (de)normalisation is exercised.
"""
from __future__ import annotations

import torch


def gemma3_text_encoder(vocab_size: int, hidden: int = 32, layers: int = 2):
    """Gemma3ForConditionalGeneration with a ``hidden``-wide, ``layers``-deep text model and a tiny SigLIP tower."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config={"vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 37,
                     "num_hidden_layers": layers, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                     "max_position_embeddings": 128, "sliding_window": 16, "pad_token_id": 0, "eos_token_id": 1,
                     "bos_token_id": 2},
        vision_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 16, "patch_size": 4},
        mm_tokens_per_image=4, boi_token_index=vocab_size - 3, eoi_token_index=vocab_size - 2,
        image_token_index=vocab_size - 1)
    return Gemma3ForConditionalGeneration(config).eval()


def ltx2_components(seed: int = 0) -> dict:
    """LTX2Pipeline components (diffusers test sizes; tiny Gemma 3; FLUX-like dynamic-shift scheduler of LTX-2)."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from flowrl.policies.tiny import t5_tokenizer

    tokenizer = t5_tokenizer()
    torch.manual_seed(seed)
    text_encoder = gemma3_text_encoder(len(tokenizer))
    hidden, layers = text_encoder.config.text_config.hidden_size, text_encoder.config.text_config.num_hidden_layers
    torch.manual_seed(seed)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
        caption_channels=hidden, rope_double_precision=False, rope_type="split")
    torch.manual_seed(seed)
    connectors = LTX2TextConnectors(
        caption_channels=hidden, text_proj_in_factor=layers + 1, video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_theta=10000.0,
        rope_double_precision=False, causal_temporal_positioning=False, rope_type="split")
    torch.manual_seed(seed)
    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,),
        layers_per_block=(1,), decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False), downsample_type=("spatial",),
        upsample_residual=(False,), upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1,
        encoder_causal=True, decoder_causal=False)
    vae.use_framewise_encoding = vae.use_framewise_decoding = False
    vae.latents_mean.copy_(torch.tensor([0.1, -0.2, 0.05, 0.3]))
    vae.latents_std.copy_(torch.tensor([0.8, 1.2, 0.9, 1.5]))
    torch.manual_seed(seed)
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
        resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
        mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8)
    torch.manual_seed(seed)
    vocoder = LTX2Vocoder(in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
                          hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2],
                          resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]], leaky_relu_negative_slope=0.1,
                          output_sampling_rate=16000)
    # dynamic shift with the pipeline's LTX-2 fallbacks (calculate_shift 1024/4096/0.95/2.05) and a terminal σ of 0.1
    # (diffusers convert_ltx2_to_diffusers.py builds the pipeline with this scheduler)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                                                base_image_seq_len=1024, max_image_seq_len=4096, shift_terminal=0.1)
    return {"transformer": transformer, "vae": vae, "audio_vae": audio_vae, "scheduler": scheduler,
            "text_encoder": text_encoder, "tokenizer": tokenizer, "connectors": connectors, "vocoder": vocoder}
