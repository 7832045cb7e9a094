"""LTX-2's composite guidance, one denoising step of ``LTX2Pipeline.__call__`` (step 7) on flowrl's joint latents.

Per stream (video, audio), in x₀ space (``convert_velocity_to_x0``: x₀ = x − σ·v), on the pipeline's packed tokens:

    x̂ = x_c + (w−1)(x_c − x_u) + stg·(x_c − x_stg) + (m−1)(x_c − x_iso)
    x̂ ← rescale_noise_cfg(x̂, x_c, φ) if φ > 0,    v = (x − x̂)/σ          (``convert_x0_to_velocity``)

x_u: the negative prompt, batched with the positive one in one forward as the pipeline does (so the rounding
matches it; CFG runs when ``cond.uncond`` is set and w > 1 or the audio w > 1); x_stg: the positive prompt with
self-attention replaced by its values at ``stg_blocks`` (when either stg > 0); x_iso: the positive prompt
with audio↔video cross-attention off (when either m > 1). Audio scales: ``config.audio_* or`` the video value.
Image-to-video (``ltx2_image.py``): with the conditioning mask κ (B, 1, F', H', W') the video timestep is per token,
``t·(1 − κ)`` packed as the tokens (``LTX2ImageToVideoPipeline``); the audio timestep and σ stay t.
"""
from __future__ import annotations

import torch
from torch import Tensor

from flowrl.types import Cond

FORWARD_EMBEDS = ("attention_mask", "video_embeds", "audio_embeds")   # the Cond entries a forward reads


def _scales(policy, guidance: float | None, cond: Cond) -> dict:
    c = policy.config
    w = (c.guidance if cond.uncond is not None else 1.0) if guidance is None else float(guidance)
    if w > 1.0 and cond.uncond is None:
        raise ValueError(f"guidance {w} > 1 needs the unconditional embeddings: encode the prompts with cfg=True, "
                         "or pass guidance=1.0")
    wa = (c.audio_guidance or w) if cond.uncond is not None else 1.0
    return {"cfg": (w, wa), "stg": (c.stg_scale, c.audio_stg_scale or c.stg_scale),
            "mod": (c.modality_scale, c.audio_modality_scale or c.modality_scale),
            "rescale": (c.guidance_rescale, c.audio_guidance_rescale or c.guidance_rescale)}


def guided_velocity(policy, x: Tensor, sigma: Tensor, cond: Cond, guidance: float | None,
                    video_mask: Tensor | None = None) -> Tensor:
    """v (B, N) float32 of both streams (module docstring); σ (B,); ``video_mask``: κ of image-to-video or None."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg
    from diffusers.pipelines.ltx2.utils import conditioning_frame_rate

    pipe, cfg = policy.pipe, policy.config
    s = _scales(policy, guidance, cond)
    video, audio = policy.split(x)
    b, _, f, h, w = video.shape
    ps, pt = pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
    hv, ha = pipe._pack_latents(video, ps, pt), pipe._pack_audio_latents(audio)
    fps = conditioning_frame_rate(cfg.frame_rate, 1.0)
    base = policy.weights.transformer
    coords = {"video_coords": base.rope.prepare_video_coords(b, f // pt, h // ps, w // ps, x.device, fps=fps),
              "audio_coords": base.audio_rope.prepare_audio_coords(b, audio.shape[2], x.device)}
    t = sigma * 1000.0
    tv = t if video_mask is None else t.unsqueeze(-1) * (1 - pipe._pack_latents(video_mask, ps, pt).squeeze(-1))
    module = policy._transformer_module()

    def forward(embeds: dict, stg=None, isolate=False, rep: int = 1) -> tuple[Tensor, Tensor]:
        def r(z):
            return z.repeat((rep,) + (1,) * (z.ndim - 1)) if rep > 1 else z

        mask, ev, ea = embeds["attention_mask"], embeds["video_embeds"], embeds["audio_embeds"]
        ov, oa = module(hidden_states=r(hv).to(policy.dtype), audio_hidden_states=r(ha).to(policy.dtype),
                        encoder_hidden_states=ev, audio_encoder_hidden_states=ea,
                        timestep=r(tv), audio_timestep=r(t), sigma=r(t), encoder_attention_mask=mask,
                        audio_encoder_attention_mask=mask,
                        num_frames=f // pt, height=h // ps, width=w // ps, fps=fps, audio_num_frames=audio.shape[2],
                        isolate_modalities=isolate, spatio_temporal_guidance_blocks=stg, perturbation_mask=None,
                        use_cross_timestep=cfg.use_cross_timestep, return_dict=False,
                        **{k: r(c) for k, c in coords.items()})
        return ov.float(), oa.float()

    sig = sigma.view(-1, 1, 1)
    lat = (hv, ha)

    def x0(outs):
        return [z - o * sig for z, o in zip(lat, outs, strict=True)]

    if cond.uncond is not None and max(s["cfg"]) > 1.0:     # one forward of [uncond; cond], as the pipeline batches it
        both = {k: torch.cat([cond.uncond[k], cond.embeds[k]]) for k in FORWARD_EMBEDS}
        halves = [o.chunk(2) for o in forward(both, rep=2)]
        uncond_x0, cond_x0 = x0([u for u, _ in halves]), x0([c for _, c in halves])
        guided = [c + (s["cfg"][i] - 1) * (c - u) for i, (c, u) in enumerate(zip(cond_x0, uncond_x0, strict=True))]
    else:
        cond_x0 = x0(forward(cond.embeds))
        guided = list(cond_x0)             # x_c + each delta in the pipeline's order (cfg, stg, modality)
    if max(s["stg"]) > 0.0:
        for i, p in enumerate(x0(forward(cond.embeds, stg=list(cfg.stg_blocks)))):
            guided[i] = guided[i] + s["stg"][i] * (cond_x0[i] - p)
    if max(s["mod"]) > 1.0:
        for i, p in enumerate(x0(forward(cond.embeds, isolate=True))):
            guided[i] = guided[i] + (s["mod"][i] - 1) * (cond_x0[i] - p)
    out = []
    for i, (z, c0) in enumerate(zip(lat, cond_x0, strict=True)):
        g = guided[i]
        if s["rescale"][i] > 0:
            g = rescale_noise_cfg(g, c0, guidance_rescale=s["rescale"][i])
        out.append((z - g) / sig)
    v_video = pipe._unpack_latents(out[0], f // pt, h // ps, w // ps, ps, pt)
    v_audio = pipe._unpack_audio_latents(out[1], audio.shape[2], num_mel_bins=audio.shape[3])
    return policy.join(v_video, v_audio)
