"""Export a policy's trained weights for plain diffusers: a LoRA file or a transformer with the adapter fused.

Two formats, both read by stock diffusers without flowrl:

* ``diffusers-lora`` (``save_diffusers_lora``): peft's ``get_peft_model_state_dict`` of the adapter, written by the
  family pipeline's own ``save_lora_weights`` (``StableDiffusion3Pipeline`` / ``FluxPipeline`` / ``WanPipeline``)
  as ``pytorch_lora_weights.safetensors`` with the peft ``LoraConfig`` (rank, α, targets) in its header, so
  ``pipe.load_lora_weights(dir)`` rebuilds the same scaling α/r. No key map of ours: the keys are peft's, the
  ``transformer.`` prefix is diffusers'.
* ``merged`` (``save_merged``): the transformer with the adapter fused, ``W = W0 + (α/r)·B·A`` (Hu et al. 2021,
  LoRA §4.1; peft ``LoraLayer.merge``), peft layers removed, written by ``save_pretrained`` so
  ``XTransformer.from_pretrained(dir)`` loads it as an ordinary model.

``merged_transformer`` is the merge alone (a deep copy; the policy keeps its adapters), reused wherever a plain
module is needed (e.g. quantised scouts).
"""
from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from flowrl.policies.lora import OLD, TRAIN, peft_name

FORMATS = ("diffusers-lora", "merged")
ADAPTERS = (TRAIN, OLD)


def _check_adapter(adapter: str) -> None:
    if adapter not in ADAPTERS:
        raise ValueError(f"adapter {adapter!r}: choose one of {ADAPTERS}")


def merged_transformer(policy, adapter: str = TRAIN, weights=None) -> nn.Module:
    """A frozen deep copy of ``policy.transformer`` with adapter ``adapter`` fused into its weights
    (W0 + (α/r)·B·A, peft's merge) and every peft layer removed; the policy itself is left untouched.

    Full fine-tune policies (no LoRA) return a copy of the weight set ``adapter`` as it is. ``weights``: one
    expert's ``TransformerWeights`` (two-expert policies; default the first trained one).
    """
    _check_adapter(adapter)
    if weights is None:
        trained = getattr(policy.weights, "trained", None)
        weights = policy.weights if trained is None else next(iter(trained.values()))
    twin = copy.deepcopy(weights.transformer)
    if not weights.is_lora:          # full fine-tune: the weight set's state is every parameter (buffers are shared)
        twin.load_state_dict(weights.state_dict(adapter), strict=False)
        return twin.eval().requires_grad_(False)
    twin.fuse_lora(adapter_names=[peft_name(adapter)])     # diffusers PeftAdapterMixin → peft LoraLayer.merge
    twin.unload_lora()                                     # drop the peft layers, keep the merged base weights
    return twin.eval().requires_grad_(False)


def save_merged(policy, out_dir: str | Path, adapter: str = TRAIN) -> Path:
    """``merged_transformer(policy, adapter).save_pretrained(out_dir)``; returns ``out_dir``. Two experts: each
    trained expert merged into ``out_dir/<component>``
    (``WanTransformer3DModel.from_pretrained(out / "transformer_2")``)."""
    out = Path(out_dir)
    trained = getattr(policy.weights, "trained", None)
    if trained is None:
        merged_transformer(policy, adapter).save_pretrained(out)
        return out
    for component, weights in trained.items():
        merged_transformer(policy, adapter, weights).save_pretrained(out / component)
    return out


def trained_transformers(policy) -> dict[str, nn.Module]:
    """Component name → trained transformer: ``{"transformer": ...}``, or each trained expert of a two-expert
    policy (Wan2.2-A14B, ``experts.ExpertWeights``)."""
    trained = getattr(policy.weights, "trained", None)
    if trained is None:
        return {"transformer": policy.weights.transformer}
    return {name: w.transformer for name, w in trained.items()}


def diffusers_lora_state_dict(policy, adapter: str = TRAIN, component: str = "transformer") -> dict:
    """peft's state dict of adapter ``adapter`` (keys ``<module>.lora_A.weight``, adapter name removed)."""
    from peft import get_peft_model_state_dict

    _check_adapter(adapter)
    if not policy.weights.is_lora:
        raise ValueError(f"{policy.family} policy was trained without LoRA (policy lora: null); export it with "
                         "--format merged instead of diffusers-lora")
    return get_peft_model_state_dict(trained_transformers(policy)[component], adapter_name=peft_name(adapter))


def save_diffusers_lora(policy, out_dir: str | Path, adapter: str = TRAIN) -> Path:
    """Write adapter ``adapter`` as ``out_dir/pytorch_lora_weights.safetensors`` with the family pipeline's
    ``save_lora_weights`` (the peft LoraConfig goes into the file's metadata); returns the file's path.

    Two experts (Wan2.2-A14B): one file per trained expert, ``out_dir/<component>/pytorch_lora_weights.safetensors``
    (the layout of published Wan2.2 high-/low-noise LoRAs), loaded by ``pipe.load_lora_weights(out/"transformer")``
    and ``pipe.load_lora_weights(out/"transformer_2", load_into_transformer_2=True)``; returns the first file.
    Pipelines without ``save_lora_weights`` (HunyuanVideo-1.5) get the same file through diffusers' LoRA writer,
    read by ``pipe.transformer.load_lora_adapter(out, weight_name=file.name, prefix="transformer")``."""
    from diffusers.loaders.lora_base import LORA_WEIGHT_NAME_SAFE

    modules = trained_transformers(policy)
    files = []
    for component, module in modules.items():
        state = diffusers_lora_state_dict(policy, adapter, component)
        metadata = module.peft_config[peft_name(adapter)].to_dict()
        out = Path(out_dir) if len(modules) == 1 and component == "transformer" else Path(out_dir) / component
        pipe_cls = type(policy.pipe)
        if hasattr(pipe_cls, "save_lora_weights"):
            pipe_cls.save_lora_weights(out, transformer_lora_layers=state, transformer_lora_adapter_metadata=metadata)
        else:   # no LoRA loader mixin (HunyuanVideo15Pipeline): the same file, for transformer.load_lora_adapter
            from diffusers.loaders.lora_base import LoraBaseMixin

            LoraBaseMixin._save_lora_weights(out, {"transformer": state}, {"transformer": metadata})
        files.append(out / LORA_WEIGHT_NAME_SAFE)
    return files[0]


def export(policy, out_dir: str | Path, fmt: str, adapter: str = TRAIN) -> Path:
    """``fmt`` "diffusers-lora" → ``save_diffusers_lora``; "merged" → ``save_merged``."""
    if fmt == "diffusers-lora":
        return save_diffusers_lora(policy, out_dir, adapter)
    if fmt == "merged":
        return save_merged(policy, out_dir, adapter)
    raise ValueError(f"export format {fmt!r}: choose one of {FORMATS}")
