"""LoRA *named* adapters on a transformer through peft: a trainable "train" and a sampling "old" adapter.

Both adapters live in the same peft tuner layers; switching changes which one the forward pass adds,
never copies weights. ``None`` means the frozen base (all adapters disabled). peft's ``set_adapter``
marks the activated adapter trainable, so every switch here re-applies the one rule of flowrl:
only the "train" adapter's parameters require grad.

Defaults are Flow-GRPO's (flow_grpo ``scripts/train_sd3.py`` L418–437): r=32, α=64,
gaussian init (A ~ N(0, 1/r), B = 0, so a fresh adapter equals the base), SD3 attention targets.
Adapter parameters are kept in float32 whatever the base dtype (Flow-GRPO casts trainable params to fp32).
"""
from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

TRAIN = "train"
OLD = "old"
PREFIX = "flowrl_"   # peft keys adapters in ModuleDicts; "train" would clash with nn.Module.train


def peft_name(name: str) -> str:
    """The adapter's key inside peft (``flowrl_<name>``); flowrl code always uses the plain name."""
    return PREFIX + name

SD3_TARGETS = ("to_k", "to_q", "to_v", "to_out.0", "add_k_proj", "add_q_proj", "add_v_proj", "to_add_out")
FLUX_TARGETS = SD3_TARGETS + ("ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2")
WAN_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2")
# FLUX.2 (diffusers transformer_flux2.py): double blocks' attention + SwiGLU FFs, single blocks' fused QKV+MLP-in
# projection and their out projection — a plain Linear named ``attn.to_out`` (the double blocks' ``to_out`` is a
# ModuleList), so it is addressed by a glob over full names (``expand_targets``).
FLUX2_TARGETS = SD3_TARGETS + ("ff.linear_in", "ff.linear_out", "ff_context.linear_in", "ff_context.linear_out",
                               "to_qkv_mlp_proj", "single_transformer_blocks.*.attn.to_out")
# Z-Image (transformer_z_image.py): attention projections and the SwiGLU feed-forward of every block and refiner
ZIMAGE_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")
QWEN_IMAGE_TARGETS = SD3_TARGETS + ("img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2")


@dataclass
class LoraConfig:
    """LoRA hyper-parameters (defaults: Flow-GRPO SD3, ``scripts/train_sd3.py``)."""

    rank: int = 32
    alpha: int = 64
    target_modules: tuple[str, ...] = SD3_TARGETS
    init: str = "gaussian"
    dropout: float = 0.0
    names: tuple[str, ...] = field(default=(TRAIN, OLD))

    def to_peft(self, target_modules: list[str] | None = None):
        from peft import LoraConfig as PeftLoraConfig

        targets = list(self.target_modules) if target_modules is None else target_modules
        return PeftLoraConfig(r=self.rank, lora_alpha=self.alpha, target_modules=targets,
                              init_lora_weights=self.init, lora_dropout=self.dropout)


def expand_targets(model: nn.Module, targets) -> list[str]:
    """``targets`` with every glob (a name holding ``*``) replaced by the full module names it matches (fnmatch),
    so peft's suffix matching can address one of two same-named modules; plain names pass through."""
    from fnmatch import fnmatchcase

    names = [n for n, _ in model.named_modules()]
    out: list[str] = []
    for t in targets:
        out += sorted(n for n in names if fnmatchcase(n, t)) if "*" in t else [t]
    return out


def tuner_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every peft tuner layer in ``model``."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [(n, m) for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)]


def adapter_names(model: nn.Module) -> list[str]:
    """Names of the adapters injected into ``model`` (in injection order)."""
    return _names(tuner_layers(model))


# The functions below walk the module tree once (``tuner_layers``) and pass the layers on: a walk of a tiny model
# costs ~0.5 ms, and ``activate`` runs around every velocity call of the trainer.
def _names(layers: list[tuple[str, nn.Module]]) -> list[str]:
    names: list[str] = []
    for _, m in layers:
        for a in m.lora_A:
            plain = a.removeprefix(PREFIX)
            if plain not in names:
                names.append(plain)
    return names


def _check_name(model: nn.Module, name: str, layers: list[tuple[str, nn.Module]] | None = None) -> None:
    known = _names(tuner_layers(model) if layers is None else layers)
    if name not in known:
        raise KeyError(f"LoRA adapter {name!r} not found on {type(model).__name__}; known adapters: {known}. "
                       f"Add it with add_adapters(model, LoraConfig(names=(..., {name!r}))).")


def adapter_named_parameters(model: nn.Module, name: str) -> dict[str, nn.Parameter]:
    """The parameters of adapter ``name``, keyed without the adapter name (portable between adapters).

    Key: ``<module path>.<lora_A|lora_B|...>.<param>``, e.g. ``transformer_blocks.0.attn.to_q.lora_A.weight``.
    """
    return _named_parameters(model, name, tuner_layers(model))


def _named_parameters(model: nn.Module, name: str, layers: list[tuple[str, nn.Module]]) -> dict[str, nn.Parameter]:
    _check_name(model, name, layers)
    out: dict[str, nn.Parameter] = {}
    for mod_name, m in layers:
        for layer_name in m.adapter_layer_names:
            store = getattr(m, layer_name)
            if peft_name(name) not in store:
                continue
            item = store[peft_name(name)]
            if isinstance(item, nn.Parameter):
                out[f"{mod_name}.{layer_name}"] = item
            else:
                for pn, p in item.named_parameters():
                    out[f"{mod_name}.{layer_name}.{pn}"] = p
    return out


def adapter_parameters(model: nn.Module, name: str) -> list[nn.Parameter]:
    """Adapter ``name``'s parameters in a fixed order (the order of ``adapter_named_parameters``)."""
    return list(adapter_named_parameters(model, name).values())


def set_trainable(model: nn.Module, trainable: str | None = TRAIN,
                  layers: list[tuple[str, nn.Module]] | None = None) -> None:
    """requires_grad = True for adapter ``trainable`` only; every other adapter (and the base) frozen: one pass
    over the layers' adapter stores (``adapter_layer_names``). ``layers`` as in ``activate``."""
    layers = tuner_layers(model) if layers is None else layers
    key = None if trainable is None else peft_name(trainable)
    for _, m in layers:
        for layer_name in m.adapter_layer_names:
            for k, item in getattr(m, layer_name).items():
                for p in (item,) if isinstance(item, nn.Parameter) else item.parameters():
                    p.requires_grad_(k == key)


def add_adapters(model: nn.Module, config: LoraConfig) -> None:
    """Inject adapters ``config.names`` (first = trainable), initialise all equal to the first, activate it.

    The base weights are frozen; adapters are float32.
    """
    from peft import inject_adapter_in_model

    if not config.names:
        raise ValueError("LoraConfig.names is empty; give at least the trainable adapter name, e.g. ('train', 'old').")
    model.requires_grad_(False)
    with warnings.catch_warnings():  # peft warns that a second adapter is being added: that is the point here
        warnings.filterwarnings("ignore", message=".*multiple adapters.*")
        for name in config.names:
            peft_config = config.to_peft(expand_targets(model, config.target_modules))
            inject_adapter_in_model(peft_config, model, adapter_name=peft_name(name))
    if not tuner_layers(model):
        raise ValueError(f"LoRA target_modules {config.target_modules} matched no layer of {type(model).__name__}; "
                         "check the module names (model.named_modules()).")
    for name in config.names:
        for p in adapter_parameters(model, name):
            p.data = p.data.float()
    for name in config.names[1:]:
        copy_adapter(model, config.names[0], name)
    activate(model, config.names[0], trainable=config.names[0])


def activate(model: nn.Module, name: str | None, trainable: str | None = TRAIN,
             layers: list[tuple[str, nn.Module]] | None = None) -> None:
    """Make adapter ``name`` the one the forward pass uses (None: base, adapters disabled); re-freeze grads.

    ``layers``: ``tuner_layers(model)`` when the caller keeps it (switching adapters adds or removes no module,
    and the walk visits every module of the model); walked here otherwise."""
    layers = tuner_layers(model) if layers is None else layers
    if name is not None:
        _check_name(model, name, layers)
    target = None if name is None else [peft_name(name)]
    for _, m in layers:
        if target is None:
            m.enable_adapters(False)
        else:
            if m.disable_adapters:
                m.enable_adapters(True)   # re-applies the layer's active adapter (one set_adapter)
            if m.active_adapters != target:
                m.set_adapter(target)
    set_trainable(model, trainable, layers)


def active_adapter(model: nn.Module) -> str | None:
    """The adapter the forward pass uses now, or None when adapters are disabled."""
    layers = tuner_layers(model)
    if not layers or layers[0][1].disable_adapters:
        return None
    return layers[0][1].active_adapters[0][len(PREFIX):]


@torch.no_grad()
def copy_adapter(model: nn.Module, src: str, dst: str) -> None:
    """dst ← src, parameter by parameter."""
    for p_dst, p_src in zip(adapter_parameters(model, dst), adapter_parameters(model, src), strict=True):
        p_dst.copy_(p_src)


@torch.no_grad()
def soft_update(dst: list[Tensor], src: list[Tensor], decay: float) -> None:
    """dst ← decay·dst + (1 − decay)·src  (Flow-GRPO / DiffusionNFT "old" policy update, ``train_nft_sd3.py``)."""
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"soft_update decay must be in [0, 1], got {decay}")
    for d, s in zip(dst, src, strict=True):
        d.mul_(decay).add_(s.to(d.dtype), alpha=1.0 - decay)


def adapter_state_dict(model: nn.Module, name: str) -> dict[str, Tensor]:
    """Detached copies of adapter ``name``'s parameters (keys without the adapter name)."""
    return {k: p.detach().clone() for k, p in adapter_named_parameters(model, name).items()}


@torch.no_grad()
def load_adapter_state_dict(model: nn.Module, name: str, state: dict[str, Tensor]) -> None:
    """Copy ``state`` into adapter ``name``; keys must match exactly (clear error otherwise)."""
    params = adapter_named_parameters(model, name)
    missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if missing or unexpected:
        raise KeyError(f"adapter state for {name!r} does not match the model: missing {missing[:5]}"
                       f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                       f"{'...' if len(unexpected) > 5 else ''}. Was it saved from a model with the same "
                       "LoRA rank and target_modules?")
    for k, p in params.items():
        if state[k].shape != p.shape:
            raise ValueError(f"adapter tensor {k!r}: saved shape {tuple(state[k].shape)} != model {tuple(p.shape)}")
        p.copy_(state[k])


def save_state(path: str | Path, state: dict[str, Tensor], meta: dict | None = None) -> None:
    """Write a tensor dict as safetensors (contiguous CPU copies), with json ``meta`` in the header."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    save_file(tensors, str(path), metadata={"flowrl": json.dumps(meta or {})})


def load_state(path: str | Path) -> dict[str, Tensor]:
    """Read a safetensors tensor dict written by ``save_state``."""
    from safetensors.torch import load_file

    if not Path(path).is_file():
        raise FileNotFoundError(f"adapter file not found: {path}")
    return load_file(str(path))


def save_adapter(model: nn.Module, name: str, path: str | Path, config: LoraConfig | None = None) -> None:
    """Save adapter ``name`` to ``path`` (.safetensors) with its LoRA config in the header."""
    save_state(path, adapter_state_dict(model, name), {"lora": asdict(config) if config else None})


def load_adapter(model: nn.Module, name: str, path: str | Path) -> None:
    """Load a file written by ``save_adapter`` into adapter ``name`` (any adapter name may receive it)."""
    load_adapter_state_dict(model, name, load_state(path))


def base_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The model's state dict as it was before LoRA injection (no lora tensors, ``base_layer.`` removed)."""
    out = {}
    for k, v in model.state_dict().items():
        if ".lora_" in k:
            continue
        out[k.replace(".base_layer.", ".")] = v
    return out
