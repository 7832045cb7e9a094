"""Activation estimate: a measured probe of the run's own transformer architecture, scaled by its dimensions.

Probe (CPU, float32, ``counter.peak_allocated``): the run's transformer config with 1 and 2 blocks (FLUX: 1 and 2
of each kind) and at most ``PROBE_WIDTH`` wide (heads cut, head_dim kept; Wan's FFN and SD3's caption projection
cut in proportion; LTX-2's audio heads, cross-attention and caption widths too), the run's LoRA targets at rank
r·D₀/D (the adapter's share of the width stays the run's), ``PROBE_ROWS`` rows of synthetic inputs at the run's token
geometry (image tokens capped at ``PROBE_TOKENS``, LTX-2's audio tokens scaled with them).
Peak bytes above entry of one transformer call (+ backward of a mean-square loss), and the bytes its graph holds
between forward and backward (the ``held`` figures, fitted the same way), then per row·token·width·byte

    k_block = (a₂ − a₁) / u,   k_rest = a₁ / u − k_block,   u = B₀·T₀·D₀·4

without and with gradient checkpointing, and k_fwd for a forward without grad (2 blocks). Scaled to the run:

    train = rows · T · D · e · (L·k_block + k_rest)        rollout = rows · T · D · e · k_fwd

(T tokens: image + text (+ LTX-2's audio, at the video width D: an upper bound), D width, L blocks (FLUX: pairs),
e the compute dtype's bytes). The law assumes the attention stores no T×T matrix (flash / memory-efficient SDPA;
CPU SDPA's flash kernel too) and activations linear in the width at fixed head_dim; it is an estimate, checked
against measurement at the toy and tiny scales only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

PROBE_ROWS = 2
PROBE_WIDTH = 256
PROBE_TOKENS = 1024


@dataclass(frozen=True)
class Coefficients:
    """Bytes per (row · token · width · element byte), measured on a probe."""

    block: float                 # per block, training forward + backward
    rest: float                  # the rest of the transformer (embeddings, output, loss) and backward temporaries
    block_ckpt: float            # per block with gradient checkpointing (the block's saved inputs)
    rest_ckpt: float             # the rest with checkpointing (incl. one block recomputed in backward)
    forward: float               # one forward without grad (the rollout's transient)
    saved: tuple                 # (block, rest, block_ckpt, rest_ckpt) held between forward and backward
    probe: dict                  # what was measured

    def train(self, units: float, checkpointing: bool) -> float:
        """Forward + backward peak, per row · token · width · byte."""
        return units * (self.block_ckpt if checkpointing else self.block) + (
            self.rest_ckpt if checkpointing else self.rest)

    def held(self, units: float, checkpointing: bool) -> float:
        """What the graph holds after the forward (before backward), per row · token · width · byte."""
        block, rest, block_ck, rest_ck = self.saved
        return units * (block_ck if checkpointing else block) + (rest_ck if checkpointing else rest)


def narrow(family: str, cfg: dict, blocks: int) -> dict:
    """``cfg`` with ``blocks`` blocks and at most PROBE_WIDTH wide (heads cut; dependent widths in proportion)."""
    heads = max(1, min(cfg["num_attention_heads"], PROBE_WIDTH // cfg["attention_head_dim"]))
    ratio = heads / cfg["num_attention_heads"]
    out = {**cfg, "num_attention_heads": heads, "num_layers": blocks}
    if family == "flux":
        out["num_single_layers"] = blocks
    if family.startswith("wan"):
        out["ffn_dim"] = max(1, round(cfg["ffn_dim"] * ratio))
    if family == "ltx2":              # cross-attention reads the caption projection's output: the inner widths
        audio = max(1, round(cfg["audio_num_attention_heads"] * ratio))
        out.update(audio_num_attention_heads=audio, cross_attention_dim=heads * cfg["attention_head_dim"],
                   audio_cross_attention_dim=audio * cfg["audio_attention_head_dim"],
                   caption_channels=max(1, round(cfg["caption_channels"] * ratio)))
    if family in ("sd3", "toy"):
        out["caption_projection_dim"] = max(1, round(cfg["caption_projection_dim"] * ratio))
        out["dual_attention_layers"] = [i for i in cfg.get("dual_attention_layers") or () if i < blocks]
    return out


def inputs(family: str, cfg: dict, image_tokens: int, text_tokens: int, rows: int, audio_tokens: int = 0) -> dict:
    """Synthetic transformer inputs of ``rows`` rows: image tokens on a square-ish grid (Wan, LTX-2: one latent
    frame; LTX-2's audio: ``audio_tokens`` packed frames)."""
    g = torch.Generator().manual_seed(0)
    side = max(1, math.isqrt(image_tokens))
    t = torch.full((rows,), 500.0)
    if family == "ltx2":              # packed tokens, both streams' prompt embeddings caption_channels wide
        a, cc = max(1, audio_tokens), cfg["caption_channels"]
        return {"hidden_states": torch.randn(rows, side * side, cfg["in_channels"], generator=g),
                "audio_hidden_states": torch.randn(rows, a, cfg["audio_in_channels"], generator=g),
                "encoder_hidden_states": torch.randn(rows, text_tokens, cc, generator=g),
                "audio_encoder_hidden_states": torch.randn(rows, text_tokens, cc, generator=g),
                "encoder_attention_mask": torch.ones(rows, text_tokens),
                "audio_encoder_attention_mask": torch.ones(rows, text_tokens), "timestep": t, "sigma": t,
                "num_frames": 1, "height": side, "width": side, "audio_num_frames": a, "use_cross_timestep": True}
    if family == "flux":
        ids = torch.zeros(side * side, 3)
        ids[:, 1], ids[:, 2] = torch.arange(side).repeat_interleave(side), torch.arange(side).repeat(side)
        return {"hidden_states": torch.randn(rows, side * side, cfg["in_channels"], generator=g),
                "encoder_hidden_states": torch.randn(rows, text_tokens, cfg["joint_attention_dim"], generator=g),
                "pooled_projections": torch.randn(rows, cfg["pooled_projection_dim"], generator=g),
                "timestep": t / 1000, "img_ids": ids, "txt_ids": torch.zeros(text_tokens, 3),
                "guidance": torch.full((rows,), 3.5) if cfg.get("guidance_embeds") else None}
    if family == "hunyuan15":         # the context split as the pipeline builds it (image, ByT5, Qwen tokens)
        img_ctx, byt5 = min(729, text_tokens // 3), min(256, text_tokens // 3)
        qwen = max(1, text_tokens - img_ctx - byt5)
        return {"hidden_states": torch.randn(rows, cfg["in_channels"], 1, side, side, generator=g), "timestep": t,
                "encoder_hidden_states": torch.randn(rows, qwen, cfg["text_embed_dim"], generator=g),
                "encoder_attention_mask": torch.ones(rows, qwen),
                "encoder_hidden_states_2": torch.randn(rows, byt5, cfg["text_embed_2_dim"], generator=g),
                "encoder_attention_mask_2": torch.ones(rows, byt5),
                "image_embeds": torch.zeros(rows, img_ctx, cfg["image_embed_dim"])}
    if family.startswith("wan"):
        p = cfg["patch_size"]
        return {"hidden_states": torch.randn(rows, cfg["in_channels"], 1, side * p[1], side * p[2], generator=g),
                "timestep": t, "encoder_hidden_states": torch.randn(rows, text_tokens, cfg["text_dim"], generator=g)}
    p = cfg["patch_size"]
    return {"hidden_states": torch.randn(rows, cfg["in_channels"], side * p, side * p, generator=g),
            "encoder_hidden_states": torch.randn(rows, text_tokens, cfg["joint_attention_dim"], generator=g),
            "pooled_projections": torch.randn(rows, cfg["pooled_projection_dim"], generator=g), "timestep": t}


def probe_bytes(family: str, cfg: dict, rank: int | None, checkpointing: bool, grad: bool, image_tokens: int,
                text_tokens: int, audio_tokens: int = 0) -> tuple[int, int]:
    """(peak bytes above entry of one call of the probe transformer ``cfg`` and, when ``grad``, its backward;
    bytes the graph holds between them)."""
    from flowrl.planning.counter import peak_allocated
    from flowrl.planning.models import build
    from flowrl.policies import POLICIES
    from flowrl.policies.lora import LoraConfig, add_adapters

    torch.manual_seed(0)
    model = build(cfg, "cpu").requires_grad_(False)
    if rank is not None:
        targets = POLICIES.get(family).config_class().lora.target_modules
        add_adapters(model, LoraConfig(rank=rank, alpha=2 * rank, target_modules=targets))
    if checkpointing:
        model.enable_gradient_checkpointing()
    model.train(grad)
    kw = inputs(family, cfg, image_tokens, text_tokens, PROBE_ROWS, audio_tokens)

    def forward():
        with torch.set_grad_enabled(grad):
            x = kw["hidden_states"].clone().requires_grad_(grad and rank is None)
            outs = model(**{**kw, "hidden_states": x}, return_dict=False)
            return outs if family == "ltx2" else outs[:1]          # LTX-2: the video and the audio velocity

    outs, peak, held = peak_allocated(forward)
    if not grad:
        return peak, 0
    backward = peak_allocated(lambda: sum(o.float().square().mean() for o in outs).backward())[1]
    return max(peak, held + backward), held


@lru_cache(maxsize=None)
def coefficients(family: str, cfg_json: str, rank: int | None, image_tokens: int, text_tokens: int,
                 audio_tokens: int = 0) -> Coefficients:
    """Measure the probe of the transformer config ``cfg_json`` (LoRA at the run's rank ``rank``, None: full
    fine-tune) at the run's token counts (image tokens capped at PROBE_TOKENS, audio tokens in proportion)."""
    import json

    cfg = json.loads(cfg_json)
    width = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    img = min(image_tokens, PROBE_TOKENS)
    img = max(1, math.isqrt(img)) ** 2                          # the square grid ``inputs`` builds
    aud = max(1, round(audio_tokens * img / image_tokens)) if audio_tokens else 0
    probes = {n: narrow(family, cfg, n) for n in (1, 2)}
    d0 = probes[1]["num_attention_heads"] * probes[1]["attention_head_dim"]
    r0 = None if rank is None else max(1, round(rank * d0 / width))
    unit = PROBE_ROWS * (img + text_tokens + aud) * d0 * 4
    both = {(n, ck): probe_bytes(family, probes[n], r0, ck, True, img, text_tokens, aud) for n in (1, 2)
            for ck in (0, 1)}
    fwd = probe_bytes(family, probes[2], r0, False, False, img, text_tokens, aud)[0]

    def fit(a: dict) -> tuple[float, float, float, float]:
        """(block, rest, block_ckpt, rest_ckpt) from the 1- and 2-block figures."""
        block, block_ck = (a[2, 0] - a[1, 0]) / unit, (a[2, 1] - a[1, 1]) / unit
        return block, a[1, 0] / unit - block, block_ck, a[1, 1] / unit - block_ck

    a = {key: v[0] for key, v in both.items()}
    block, rest, block_ck, rest_ck = fit(a)
    return Coefficients(block=block, rest=rest, block_ckpt=block_ck, rest_ckpt=rest_ck, forward=fwd / unit,
                        saved=fit({key: v[1] for key, v in both.items()}),
                        probe={"bytes": {f"{n}_blocks{'_ckpt' if ck else ''}": v for (n, ck), v in a.items()},
                               "forward_bytes": fwd, "rows": PROBE_ROWS, "tokens": img + text_tokens + aud, "width": d0,
                               "lora_rank": r0})
