"""Load and save a policy's components in the diffusers pipeline layout (model_index.json + subfolders).

Loading goes through the real ``from_pretrained(path, subfolder=name)`` of diffusers / transformers, so
a hub id (``stabilityai/stable-diffusion-3.5-medium``) and a local directory written by ``save_components``
take the same code path. The transformer is saved without LoRA tensors (the base weights); adapters are
saved next to it under ``adapters/<name>.safetensors`` by the policy.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import torch
from torch import Tensor, nn

# component name → (library, class) as in a diffusers model_index.json
Spec = dict[str, tuple[str, str]]

TOKENIZER = ("transformers", "AutoTokenizer")
ADAPTER_DIR = "adapters"
POLICY_CONFIG = "flowrl_policy.json"


def _class(library: str, name: str):
    return getattr(importlib.import_module(library), name)


def load_components(path: str, spec: Spec, dtype: torch.dtype, device: torch.device | str,
                    fp32: tuple[str, ...] = ("vae",), skip: tuple[str, ...] = ()) -> dict:
    """Each component of ``spec`` via its class' ``from_pretrained(path, subfolder=name)``.

    Models are cast to ``dtype`` except those named in ``fp32`` (the VAE stays float32, Flow-GRPO practice),
    moved to ``device`` and put in eval mode with grads off (the policy re-enables what trains).
    """
    out = {}
    for name, (library, cls_name) in spec.items():
        if name in skip:
            continue
        cls = _class(library, cls_name)
        if name.startswith("tokenizer") or name in ("scheduler", "processor", "guider"):   # configs, not weights
            out[name] = cls.from_pretrained(path, subfolder=name)
        else:
            want = torch.float32 if name in fp32 else dtype
            key = "torch_dtype" if library == "diffusers" else "dtype"
            model = cls.from_pretrained(path, subfolder=name, **{key: want})
            out[name] = model.to(device).eval().requires_grad_(False)
    return out


def save_components(directory: str | Path, pipeline_class: str, components: dict,
                    transformer_state: dict[str, Tensor] | None = None, extra_index: dict | None = None,
                    states: dict[str, dict[str, Tensor]] | None = None) -> Path:
    """Write ``components`` in the diffusers pipeline layout; ``transformer_state`` replaces the
    transformer's weights (the LoRA-free base), written as ``diffusion_pytorch_model.safetensors``; ``states``
    does the same for any component by name (two-expert pipelines: ``transformer`` and ``transformer_2``)."""
    import diffusers
    from diffusers.utils import SAFETENSORS_WEIGHTS_NAME
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    index = {"_class_name": pipeline_class, "_diffusers_version": diffusers.__version__}
    states = dict(states or {})
    if transformer_state is not None:
        states["transformer"] = transformer_state
    for name, comp in components.items():
        sub = directory / name
        if name in states:
            comp.save_config(sub)
            tensors = {k: v.detach().to("cpu").contiguous() for k, v in states[name].items()}
            save_file(tensors, str(sub / SAFETENSORS_WEIGHTS_NAME), metadata={"format": "pt"})
        else:
            comp.save_pretrained(sub)
        index[name] = [_library_of(comp), type(comp).__name__]
    index.update(extra_index or {})
    (directory / "model_index.json").write_text(json.dumps(index, indent=2))
    return directory


def _library_of(obj) -> str:
    root = type(obj).__module__.split(".")[0]
    if root not in ("diffusers", "transformers"):
        raise TypeError(f"cannot record {type(obj).__name__} (module {type(obj).__module__}) in model_index.json; "
                        "components must be diffusers or transformers classes")
    return root


def write_policy_config(directory: str | Path, config: dict) -> None:
    (Path(directory) / POLICY_CONFIG).write_text(json.dumps(config, indent=2, default=str))


def read_policy_config(directory: str | Path) -> dict | None:
    file = Path(directory).expanduser() / POLICY_CONFIG
    return json.loads(file.read_text()) if file.is_file() else None


def adapter_path(directory: str | Path, name: str) -> Path:
    return Path(directory) / ADAPTER_DIR / f"{name}.safetensors"


def is_local(path: str | Path) -> bool:
    return Path(path).expanduser().is_dir()


def freeze(module: nn.Module) -> nn.Module:
    return module.eval().requires_grad_(False)


def load_policy(cls, path: str, dtype: torch.dtype, device, config=None):
    """A ``PolicyBase`` subclass from ``path``: the Config a ``save_pretrained`` directory holds (read first, so a
    directory of another family is refused before any weight loads), every ``cls.spec`` component via its
    ``from_pretrained(path, subfolder=...)`` (VAE float32), ``cls._pipeline_kwargs(path)``, then saved adapters."""
    config = config or cls._saved_config(path)
    policy = cls(load_components(path, cls.spec, dtype, device), config, device, dtype, **cls._pipeline_kwargs(path))
    policy._load_saved_adapters(path)
    return policy

