"""Qwen-Image-Edit as a flowrl policy: Qwen-Image conditioned on one source image (``accepts_images``).

Components (diffusers ``QwenImageEditPipeline``): those of Qwen-Image plus a ``Qwen2VLProcessor``. What changes
against text-to-image (``pipeline_qwenimage_edit.py``):

* the source image is resized to ``reference_area`` pixels (1024² in the pipeline, ``calculate_dimensions``:
  the source's aspect ratio, sides multiples of 32) whatever the output size;
* text goes through the VL model *with the image*: the edit template (``<|vision_start|><|image_pad|>
  <|vision_end|>`` before the instruction), the processor's pixel values and grid, last hidden state, the first
  64 tokens dropped (the pipeline's ``encode_prompt``); the negative text is encoded with the same image;
* the resized source is VAE-encoded (``latent_dist.mode()``, the pipeline's ``sample_mode="argmax"``),
  normalised ``(z − mean)/std``, packed, and its tokens are appended after the noisy ones:

      v = F([pack(x); pack(z_src)], t, img_shapes = [(1, h/2, w/2), (1, h_src/2, w_src/2)])[:, :hw/4]

  both CFG branches see the same reference tokens; the norm-rescaled true CFG is Qwen-Image's.

``encode(prompts, images=...)`` puts ``image_latents`` (B, L_src, 64) and ``image_grid`` (B, 1, 2) into
``Cond.embeds`` (batch-first, so ``Cond.select`` and grouping work). One forward needs one reference grid for all
its rows (the transformer's RoPE reads the first row's ``img_shapes``), so a batch's sources must share an aspect
ratio (same resized size); a mixed batch raises. ``QwenImageEditPlusPolicy`` (below) takes several sources per
prompt. Deviation: a source that is not already ``reference_area``-sized
is resized with antialiased bilinear interpolation (the pipeline: PIL Lanczos); the VL branch receives it as 8-bit
RGB, as the pipeline's PIL input is. Defaults as Qwen-Image (true-CFG 4.0, negative " ", LoRA r64/α128).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.policies import components as comp
from flowrl.policies.flux import pack_latents
from flowrl.policies.qwen_image import NEGATIVE, QwenImagePolicy
from flowrl.policies.qwen_image import SPEC as QWEN_IMAGE_SPEC
from flowrl.policies.qwen_image import Config as QwenImageConfig
from flowrl.types import Cond

HUB_IDS = {"qwen-image-edit": "Qwen/Qwen-Image-Edit", "qwen-image-edit-2509": "Qwen/Qwen-Image-Edit-2509",
           "qwen-image-edit-2511": "Qwen/Qwen-Image-Edit-2511"}

SPEC: comp.Spec = {**QWEN_IMAGE_SPEC, "processor": ("transformers", "Qwen2VLProcessor")}  # + the VL image input


@dataclass
class Config(QwenImageConfig):
    reference_area: int = 1024 * 1024    # source image pixels after resizing (pipeline: 1024 * 1024)


def reference_size(area: int, height: int, width: int) -> tuple[int, int]:
    """(H, W) of a source resized to ``area`` pixels at its aspect ratio, sides rounded to multiples of 32
    (diffusers ``pipeline_qwenimage_edit.calculate_dimensions``)."""
    ratio = width / height
    w = math.sqrt(area * ratio)
    h = w / ratio
    return round(h / 32) * 32, round(w / 32) * 32


def to_pil(image: Tensor):
    """(3, H, W) float in [0, 1] → 8-bit RGB PIL image (the VL processor's input)."""
    from PIL import Image

    arr = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(arr)


class QwenImageEditPolicy(QwenImagePolicy):
    """Qwen-Image-Edit policy: ``encode(prompts, images=[[src], ...])`` with one source image per prompt."""

    family = "qwen_image_edit"
    pipeline_class = "QwenImageEditPipeline"
    spec = SPEC
    config_class = Config
    accepts_images = True
    requires_images = True
    default_path = HUB_IDS["qwen-image-edit"]

    max_images: int | None = 1          # source images per prompt (Edit: exactly one; Edit-Plus: any)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None, cfg: bool = True,
               images: Sequence | None = None) -> Cond:
        """Text + source image(s) through the VL encoder (``prompt_embeds``, ``prompt_embeds_mask``) and the
        sources' packed VAE tokens (``image_latents`` (B, ΣL_k, 64), ``image_grid`` (B, K, 2)); uncond: the
        negative text with the same images."""
        prompts = list(prompts)
        rows = self.check_images(images, len(prompts))
        if rows is None or any(r is None or (self.max_images is not None and len(r) != self.max_images)
                               for r in rows):
            raise ValueError(f"{self.family} edits {self._how_many} per prompt: give images=[[image, ...], ...] "
                             "for every prompt (a prompt file line needs an 'image' or 'images')")
        refs = [[self._resize(img, self.config.reference_area) for img in row] for row in rows]
        sizes = {tuple(tuple(r.shape) for r in row) for row in refs}
        if len(sizes) > 1:
            raise ValueError(f"{self.family}: one batch's source images resize to different sizes {sorted(sizes)}; "
                             "use sources of one aspect ratio (and count) per batch, or sampler.chunk: 1")
        vl = [[to_pil(img) for img in self._vl_images(row, ref)] for row, ref in zip(rows, refs, strict=True)]
        embeds = {**self._text(prompts, vl), **self._vae_tokens(refs)}
        negs = list(negative_prompts) if negative_prompts is not None else [NEGATIVE] * len(prompts)
        return Cond(embeds, self._text(negs, vl) if cfg else None, prompts)

    @property
    def _how_many(self) -> str:
        return "one source image" if self.max_images == 1 else "one or more source images"

    def _vl_images(self, row: list[Tensor], refs: list[Tensor]) -> list[Tensor]:
        """What the VL encoder sees: Edit, the VAE-sized source itself (the pipeline's ``prompt_image``)."""
        return refs

    def _text(self, prompts: list[str], vl: list[list]) -> dict[str, Tensor]:
        """The pipeline's ``encode_prompt`` with a list of one image per prompt (Edit batches them)."""
        return self._encode(prompts, image=[imgs[0] for imgs in vl])

    @staticmethod
    def _resize(image: Tensor, area: int) -> Tensor:
        h, w = reference_size(area, image.shape[-2], image.shape[-1])
        image = image.float().clamp(0, 1)
        if (h, w) == tuple(image.shape[-2:]):
            return image
        out = torch.nn.functional.interpolate(image[None], size=(h, w), mode="bilinear", antialias=True,
                                              align_corners=False)
        return out[0].clamp(0, 1)

    def _vae_tokens(self, refs: list[list[Tensor]]) -> dict[str, Tensor]:
        """Packed, normalised VAE latents of each row's sources, concatenated along the tokens in order
        (pipeline ``_encode_vae_image`` + ``_pack_latents``, Edit-Plus ``torch.cat(all_image_latents, dim=1)``)."""
        cfg = self.vae.config
        shape = (1, cfg.z_dim, 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean).view(shape).to(self.vae.device, self.vae.dtype)
        std = torch.tensor(cfg.latents_std).view(shape).to(self.vae.device, self.vae.dtype)
        tokens, grids = [], []
        for row in refs:
            row_tokens, row_grid = [], []
            for ref in row:
                x = (ref * 2 - 1)[None, :, None].to(self.vae.device, self.vae.dtype)
                z = ((self.vae.encode(x).latent_dist.mode() - mean) / std)[:, :, 0]
                row_tokens.append(pack_latents(z.float()))
                row_grid.append([z.shape[-2] // 2, z.shape[-1] // 2])
            tokens.append(torch.cat(row_tokens, dim=1))
            grids.append(torch.tensor([row_grid]))
        return {"image_latents": torch.cat(tokens).to(self.device), "image_grid": torch.cat(grids).to(self.device)}

    def _image_tokens(self, image: dict, h: int, w: int) -> tuple[Tensor | None, list[tuple[int, int, int]]]:
        grid = image["image_grid"]
        if bool((grid != grid[0]).any()):
            raise ValueError(f"{self.family}: rows with different source-image grids {grid.unique(dim=0).tolist()} "
                             "in one forward; the transformer's RoPE takes one set of grids per batch")
        return image["image_latents"], [(1, int(gh), int(gw)) for gh, gw in grid[0].tolist()]


@dataclass
class PlusConfig(Config):
    condition_area: int = 384 * 384      # VL-encoder input pixels per source (pipeline CONDITION_IMAGE_SIZE)


class QwenImageEditPlusPolicy(QwenImageEditPolicy):
    """Qwen-Image-Edit-Plus (2509 / 2511): several source images per prompt (``QwenImageEditPlusPipeline``).

    Differences from Edit (``pipeline_qwenimage_edit_plus.py``): the user text is prefixed by
    "Picture k: <|vision_start|><|image_pad|><|vision_end|>" per source (k = 1, 2, ...), the VL encoder sees each
    source resized to ``condition_area`` (384²) while the VAE tokens use ``reference_area`` (1024²), every
    source's tokens follow the noisy ones in order with one ``img_shapes`` entry each. The pipeline encodes one
    prompt at a time; flowrl encodes each row alone the same way and pads the text (mask 0) to the batch.
    Checkpoints with ``zero_cond_t`` (2511: reference tokens at t = 0) run through the same call unchanged.
    """

    family = "qwen_image_edit_plus"
    pipeline_class = "QwenImageEditPlusPipeline"
    config_class = Config = PlusConfig   # ``Config``: what the run config's policy section builds (config.loader)
    max_images = None
    default_path = HUB_IDS["qwen-image-edit-2509"]

    def _vl_images(self, row: list[Tensor], refs: list[Tensor]) -> list[Tensor]:
        return [self._resize(img, self.config.condition_area) for img in row]

    def _text(self, prompts: list[str], vl: list[list]) -> dict[str, Tensor]:
        from samplers.engine import cat_rows

        per_row = [self._encode([p], image=imgs) for p, imgs in zip(prompts, vl, strict=True)]
        return {k: cat_rows([r[k] for r in per_row]) for k in per_row[0]}
