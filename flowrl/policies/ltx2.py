"""LTX-2 (19B, joint audio + video) text-to-video as a flowrl policy, exactly as diffusers' ``LTX2Pipeline`` runs it.

Components (``pipeline_ltx2.py``): LTX2VideoTransformer3DModel (48 blocks; one call returns the video and the audio
velocity), a Gemma 3 text encoder (all hidden states stacked) + ``LTX2TextConnectors`` (video and audio prompt
embeddings), AutoencoderKLLTX2Video (×8 time, ×32 space, 128 channels), AutoencoderKLLTX2Audio + vocoder.

State: LTX-2 denoises video and audio together, so the policy's latents are **both streams, flattened into one row**:
``x = cat([video.flatten(1), audio.flatten(1)], 1)`` of shape (B, C·F'·H'·W' + C_a·L·M'), in the pipeline's own
normalised space (video (B, C, F', H', W'), audio (B, C_a, L, M'), L = round(F/fps · sr/hop/4)). The RL kernels act
on both streams jointly (the SDE noise and log-prob cover video and audio); ``decode`` returns the video,
``decode_audio`` the waveform; ``split`` gives the two streams. Velocity, one pipeline step (x₀ space, per stream):

    x̂ = x_c + (w−1)(x_c − x_u) + stg·(x_c − x_stg) + (m−1)(x_c − x_iso),   x_· = x − σ·v_·,   t = 1000·σ
    x̂ ← rescale_noise_cfg(x̂, x_c, rescale) when rescale > 0,               v = (x − x̂)/σ

(x_stg: self-attention skipped at ``stg_blocks``; x_iso: ``isolate_modalities``; audio scales default to the video
ones through the pipeline's ``or``). CFG needs ``cond.uncond`` (encode with cfg=True); without it only STG / modality
terms apply. σ grid: ``linspace(1, 1/N, N)`` with μ = calculate_shift(F'·H'·W', base/max seq len and shifts of the
scheduler config), the scheduler's dynamic shift (and ``shift_terminal``), then 0; the audio stream uses the same grid.
Decode: denormalise (``latents·std/scaling + mean``), ``vae.decode`` (timestep 0 when the VAE is timestep-conditioned,
the pipeline's ``decode_timestep`` default), ``postprocess_video`` → (B, F, 3, H, W) in [0, 1].
Defaults are the stock pipeline's (CFG 3, audio CFG 7, STG 1 at block 28, modality 3, rescale 0.7: four transformer
evaluations a step); the Flow-Factory recipe (``configs/ltx2/``) turns all of them off for training.
LoRA: r64/α128 on Flow-Factory's 28 Linear layers of every block (``LTX2_TARGETS``), exported to the
``LTX2LoraLoaderMixin`` layout.
Image-to-video (``LTX2ImageToVideoPipeline``, the same checkpoint): ``encode(..., images=...)`` takes an optional
first frame per prompt; ``ltx2_image.py`` holds the conditioning (clean latent frame 0, its tokens at t = 0).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.policies import components as comp
from flowrl.policies.base import PolicyBase, scheduler_sigmas, sigma_batch
from flowrl.policies.lora import LoraConfig
from flowrl.types import Cond

HUB_ID = "Lightricks/LTX-2"
SPEC: comp.Spec = {
    "transformer": ("diffusers", "LTX2VideoTransformer3DModel"),
    "vae": ("diffusers", "AutoencoderKLLTX2Video"),
    "audio_vae": ("diffusers", "AutoencoderKLLTX2Audio"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Gemma3ForConditionalGeneration"),
    "tokenizer": comp.TOKENIZER,
    "connectors": ("diffusers.pipelines.ltx2", "LTX2TextConnectors"),
    "vocoder": ("diffusers.pipelines.ltx2.vocoder", "LTX2Vocoder"),
}
# Flow-Factory ``models/ltx2/ltx2_t2av.py`` default_target_modules: 6 attentions × 4 projections + 2 FFNs × 2
_ATTN = ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
LTX2_TARGETS = tuple(f"{a}.{p}" for a in _ATTN for p in ("to_q", "to_k", "to_v", "to_out.0")) + (
    "ff.net.0.proj", "ff.net.2", "audio_ff.net.0.proj", "audio_ff.net.2")
EMBEDS = ("video_embeds", "audio_embeds", "attention_mask")


@dataclass
class Config:
    guidance: float = 3.0                   # video CFG w (pipeline ``guidance_scale``)
    audio_guidance: float | None = 7.0      # audio CFG; None/0 → w (the pipeline's ``or``)
    stg_scale: float = 1.0                  # spatio-temporal guidance (0 = off)
    audio_stg_scale: float | None = 1.0
    stg_blocks: tuple[int, ...] = (28,)
    modality_scale: float = 3.0             # modality-isolation guidance (1 = off)
    audio_modality_scale: float | None = 3.0
    guidance_rescale: float = 0.7           # rescale_noise_cfg φ in x₀ space (0 = off)
    audio_guidance_rescale: float | None = 0.7
    frame_rate: float = 24.0                # fps: RoPE coordinates and the audio length
    use_cross_timestep: bool = True         # the pipeline's default (LTX-2.3 behaviour; False = LTX-2.0)
    max_sequence_length: int = 1024
    image_crf: int | None = None            # first frames' H.264 CRF (None → the pipeline's: 33 for Gemma 3; 0 off)
    lora: LoraConfig | None = field(default_factory=lambda: LoraConfig(rank=64, alpha=128,
                                                                       target_modules=LTX2_TARGETS))
    keep_base: bool = True
    gradient_checkpointing: bool = False


class LTX2Policy(PolicyBase):
    """LTX-2 T2V(+audio) policy. Build with ``from_pretrained`` (hub id or local dir) or ``tiny()``."""

    family = "ltx2"
    pipeline_class = "LTX2Pipeline"
    spec = SPEC
    config_class = Config
    default_path = HUB_ID
    temporal_factor = 8
    # the published model_index.json names these by pipeline module (diffusers resolves "ltx2" → pipelines.ltx2)
    index_entries = {"connectors": ["ltx2", "LTX2TextConnectors"], "vocoder": ["ltx2", "LTX2Vocoder"]}
    spatial_multiple = 32
    tiny_spatial_multiple = 2
    accepts_images = True                   # optional first frames (image-to-video)

    def __init__(self, components: dict, config: Config | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None):
        from diffusers import LTX2Pipeline

        self._setup(components, config or Config(), device, dtype)
        self.pipe = LTX2Pipeline(**components)
        self._geometry: dict[int, tuple[int, ...]] = {}

    @classmethod
    def tiny(cls, seed: int = 0, config: Config | None = None, device: torch.device | str = "cpu") -> LTX2Policy:
        """Tiny offline LTX-2 (``tiny_ltx2.ltx2_components``), float32."""
        from flowrl.policies.tiny_ltx2 import ltx2_components

        return cls(ltx2_components(seed), config or Config(), device, torch.float32)

    @classmethod
    def _spatial_multiple_from(cls, vae: dict, transformer: dict) -> int:
        return int(vae.get("spatial_compression_ratio") or 32) * int(transformer.get("patch_size", 1))

    # ---- geometry: the joint row ↔ (video, audio) ---------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """(C·F'·H'·W' + C_a·L·M',): both streams of one sample, flattened (module docstring)."""
        p = self.pipe
        ft, fs = p.vae_temporal_compression_ratio, p.vae_spatial_compression_ratio
        if num_frames is None or (num_frames - 1) % ft:
            raise ValueError(f"num_frames − 1 must be divisible by {ft} for LTX-2, got {num_frames}")
        if height % fs or width % fs:
            raise ValueError(f"height and width must be multiples of {fs} for LTX-2, got {height}×{width}")
        video = (self.transformer.config.in_channels, (num_frames - 1) // ft + 1, height // fs, width // fs)
        per_second = p.audio_sampling_rate / p.audio_hop_length / float(p.audio_vae_temporal_compression_ratio)
        audio = (self.pipe.audio_vae.config.latent_channels, round(num_frames / self.config.frame_rate * per_second),
                 self.pipe.audio_vae.config.mel_bins // p.audio_vae_mel_compression_ratio)
        n = _numel(video) + _numel(audio)
        if self._geometry.get(n, (video, audio)) != (video, audio):
            raise ValueError(f"two LTX-2 latent sizes flatten to {n} values ({self._geometry[n]} and {(video, audio)}"
                             "); sample one resolution at a time")
        self._geometry[n] = (video, audio)
        return (n,)

    def split(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Joint latents (B, N) → video (B, C, F', H', W'), audio (B, C_a, L, M') (views)."""
        if x.dim() != 2 or x.shape[1] not in self._geometry:
            raise ValueError(f"LTX-2 latents (B, N) of a size made by latent_shape(height, width, num_frames); got "
                             f"{tuple(x.shape)} (call latent_shape / noise for that resolution first)")
        video, audio = self._geometry[x.shape[1]]
        nv = _numel(video)
        return x[:, :nv].reshape(-1, *video), x[:, nv:].reshape(-1, *audio)

    @staticmethod
    def join(video: Tensor, audio: Tensor) -> Tensor:
        return torch.cat([video.flatten(1), audio.flatten(1)], dim=1)

    def noise(self, generators: Sequence[torch.Generator], height: int, width: int,
              num_frames: int | None = None) -> Tensor:
        """Row b: video noise then audio noise from ``generators[b]``, in the pipeline's draw order."""
        if len(generators) == 0:
            raise ValueError("noise() needs one torch.Generator per sample; got an empty list")
        n = self.latent_shape(height, width, num_frames)[0]
        video, audio = self._geometry[n]
        rows = [torch.randn((1, *video), generator=g, device=g.device) for g in generators]
        rows = [self.join(v, torch.randn((1, *audio), generator=g, device=g.device))
                for v, g in zip(rows, generators, strict=True)]
        return torch.cat(rows).to(self.device)

    # ---- conditioning ------------------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None,
               cfg: bool = True, images: Sequence | None = None) -> Cond:
        """The pipeline's ``encode_prompt`` (Gemma hidden states, left padding) through the connectors: video and audio
        prompt embeddings + the connector mask; uncond from ``negative_prompts`` (default ""); ``images`` (length B,
        each a list of (3, H, W) [0, 1] tensors or None): each row's first image (``ltx2_image``)."""
        from flowrl.policies.ltx2_image import store_first_frames

        self.check_images(images, len(prompts))
        prompts = list(prompts)

        def enc(texts):
            pe, mask, _, _ = self.pipe.encode_prompt(prompt=texts, do_classifier_free_guidance=False,
                                                     max_sequence_length=self.config.max_sequence_length,
                                                     device=self.device, dtype=self.dtype)
            side = getattr(self.pipe.tokenizer, "padding_side", "left")
            return dict(zip(EMBEDS, self.pipe.connectors(pe, mask, padding_side=side), strict=True))

        neg = [""] * len(prompts) if negative_prompts is None else list(negative_prompts)
        return store_first_frames(self, Cond(enc(prompts), enc(neg) if cfg else None, prompts), images, len(prompts))

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """``linspace(1, 1/N, N)`` shifted with μ = calculate_shift(video tokens, ...), then 0 (pipeline step 5)."""
        import numpy as np
        from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

        video, _ = self.split(latents)
        pt, ps = self.pipe.transformer_temporal_patch_size, self.pipe.transformer_spatial_patch_size
        tokens = (video.shape[2] // pt) * (video.shape[3] // ps) * (video.shape[4] // ps)
        c = self.scheduler_config
        mu = calculate_shift(tokens, c.get("base_image_seq_len", 1024), c.get("max_image_seq_len", 4096),
                             c.get("base_shift", 0.95), c.get("max_shift", 2.05))
        grid = np.linspace(1.0, 1 / num_steps, num_steps)
        return scheduler_sigmas(c, num_steps, mu=mu, sigmas=grid).to(latents.device)

    # ---- velocity ----------------------------------------------------------------------------------------
    def velocity(self, x: Tensor, sigma: Tensor | float, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) (B, N) float32 for both streams: the pipeline's composite guidance in x₀ space (with a first
        frame: the I2V pipeline's conditioning, ``ltx2_image.image_velocity``)."""
        from flowrl.policies.ltx2_image import image_velocity

        return image_velocity(self, x, sigma_batch(sigma, x.shape[0], x.device), cond, guidance)

    # ---- decode ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Videos (B, F, 3, H, W) in [0, 1] from the video stream (pipeline's decode, ``decode_timestep`` 0)."""
        vae = self.vae
        z, _ = self.split(latents)
        z = self.pipe._denormalize_latents(z.to(vae.device), vae.latents_mean, vae.latents_std,
                                           vae.config.scaling_factor).to(vae.dtype)
        t = torch.zeros(z.shape[0], device=z.device, dtype=z.dtype) if vae.config.timestep_conditioning else None
        video = vae.decode(z, t, return_dict=False)[0]
        return self.pipe.video_processor.postprocess_video(video, output_type="pt").float()

    @torch.no_grad()
    def decode_audio(self, latents: Tensor) -> Tensor:
        """Waveforms (B, channels, samples) from the audio stream: denormalise, audio VAE, vocoder (pipeline)."""
        avae = self.pipe.audio_vae
        _, a = self.split(latents)
        packed = self.pipe._pack_audio_latents(a.to(avae.device))           # statistics are per packed feature
        packed = self.pipe._denormalize_audio_latents(packed, avae.latents_mean, avae.latents_std)
        a = self.pipe._unpack_audio_latents(packed, a.shape[2], num_mel_bins=a.shape[3])
        mel = avae.decode(a.to(avae.dtype), return_dict=False)[0]
        return self.pipe.vocoder(mel).float()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
