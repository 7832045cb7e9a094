"""LTX-2 in ``scripts/bench.py gpu --families ltx2`` (opt-in): the 19B transformer from configs/gpu with random weights.

Around it, as for the other families (``flowrl/bench/benchmarks/gpu.py``): a tiny random Gemma 3 (one layer) whose
text width is the transformer's ``caption_channels`` (3840), ``LTX2TextConnectors`` of one layer at that width
(``caption_channels / 128`` heads × 128, no learnable registers), a narrow ``AutoencoderKLLTX2Video`` with the real
factors (×32 space: patch 4 × three ×2 stages, ×8 time; 128 channels), the default ``AutoencoderKLLTX2Audio`` and
``LTX2Vocoder`` (108M, the real audio layout: 8 channels × 16 mel latents = the transformer's 128 audio inputs),
and the flow-match scheduler of ``tiny_ltx2`` (LTX-2's dynamic-shift constants). Geometry: the recipe's 512×768×121
(6144 video + 126 audio tokens), batch 1, the policy's default guidance (CFG 3, audio 7, STG at block 28, modality
3, rescale 0.7: four transformer calls a step), gradient checkpointing. The stock ``LTX2Pipeline`` gets flowrl's
latents packed (video) and denormalised (audio: the pipeline normalises audio latents it is given), and its
``output_type="latent"`` result (denormalised) is normalised back into flowrl's joint row.
"""
from __future__ import annotations

import torch

CONFIG = "ltx2_transformer.json"
GEOMETRY = {"full": (512, 768, 121, 1), "tiny": (64, 64, 9, 1)}     # tiny: 2×2×2 video + 9 audio tokens
NOISE_LEVEL = 0.8                          # flow_sde a at the recipe's noise level (its CPS 0.8, Flow-Factory)
TINY_SEQ = 64                                                      # text tokens at --scale tiny (CPU smoke)


def shrink(cfg: dict) -> dict:
    """The same architecture at test size: 2 blocks, video 2×16 heads, audio 2×8, caption width 64."""
    return {**cfg, "num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 16, "cross_attention_dim": 32,
            "audio_num_attention_heads": 2, "audio_attention_head_dim": 8, "audio_cross_attention_dim": 16,
            "caption_channels": 64}


def bench_config(cls, scale: str):
    """The policy's default Config (its guidance), gradient checkpointing, STG at a block the shrunk model has."""
    short = {"max_sequence_length": TINY_SEQ, "stg_blocks": (1,)} if scale == "tiny" else {}
    return cls.config_class(gradient_checkpointing=True, **short)


def video_vae():
    """AutoencoderKLLTX2Video with LTX-2's factors (×32 space, ×8 time, 128 latent channels), 8–32 wide. The ratios
    are passed: the class derives 64 / 16 from its four scaling flags, while its encoder gives 32 / 8."""
    from diffusers import AutoencoderKLLTX2Video

    return AutoencoderKLLTX2Video(block_out_channels=(8, 16, 32, 32), decoder_block_out_channels=(8, 16, 32),
                                  layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
                                  spatial_compression_ratio=32, temporal_compression_ratio=8)


def components(transformer, dtype: torch.dtype, device=None) -> dict:
    """LTX2Pipeline components around ``transformer`` (module docstring); text side on ``device``."""
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from flowrl.policies.tiny import t5_tokenizer
    from flowrl.policies.tiny_ltx2 import gemma3_text_encoder, ltx2_components

    width = transformer.config.caption_channels
    heads = max(1, width // 128)
    tokenizer = t5_tokenizer()
    torch.manual_seed(1)
    text_encoder = gemma3_text_encoder(len(tokenizer), hidden=width, layers=1)
    side = {f"{m}_connector_{k}": v for m in ("video", "audio") for k, v in
            (("num_attention_heads", heads), ("attention_head_dim", width // heads), ("num_layers", 1),
             ("num_learnable_registers", None))}
    connectors = LTX2TextConnectors(caption_channels=width, text_proj_in_factor=2, connector_rope_base_seq_len=32,
                                    rope_double_precision=False, rope_type="split", **side)
    device = transformer.device if device is None else device
    text = {k: m.to(device, dtype).eval().requires_grad_(False) for k, m in
            (("text_encoder", text_encoder), ("connectors", connectors))}
    decoders = {"vae": video_vae(), "audio_vae": AutoencoderKLLTX2Audio(), "vocoder": LTX2Vocoder()}
    return {"transformer": transformer, "tokenizer": tokenizer, "scheduler": ltx2_components()["scheduler"], **text,
            **{k: m.to(device).eval() for k, m in decoders.items()}}


def pipeline_call(policy, x, steps, geometry, seq_len, prompts):
    """The stock pipeline from flowrl's joint latents ``x`` → its final latents as one joint row (module doc)."""
    h, w, frames, _ = geometry
    pipe, cfg = policy.pipe, policy.config
    video, audio = policy.split(x)
    avae, vae = pipe.audio_vae, pipe.vae
    packed_audio = pipe._denormalize_audio_latents(pipe._pack_audio_latents(audio), avae.latents_mean,
                                                   avae.latents_std)
    out = pipe(prompt=list(prompts[:x.shape[0]]), latents=pipe._pack_latents(video), audio_latents=packed_audio,
               num_inference_steps=steps, height=h, width=w, num_frames=frames, frame_rate=cfg.frame_rate,
               max_sequence_length=seq_len, guidance_scale=cfg.guidance, audio_guidance_scale=cfg.audio_guidance,
               stg_scale=cfg.stg_scale, audio_stg_scale=cfg.audio_stg_scale, modality_scale=cfg.modality_scale,
               audio_modality_scale=cfg.audio_modality_scale, guidance_rescale=cfg.guidance_rescale,
               audio_guidance_rescale=cfg.audio_guidance_rescale, use_cross_timestep=cfg.use_cross_timestep,
               spatio_temporal_guidance_blocks=list(cfg.stg_blocks), output_type="latent")
    v = pipe._normalize_latents(out.frames.float(), vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    a = pipe._normalize_audio_latents(pipe._pack_audio_latents(out.audio.float()), avae.latents_mean,
                                      avae.latents_std)
    return policy.join(v, pipe._unpack_audio_latents(a, audio.shape[2], num_mel_bins=audio.shape[3]))
