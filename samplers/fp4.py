"""FP4 fake quantisation for candidate-pool scouts: NVFP4 / MXFP4 quantize → dequantize through torchao's own
tensor types, a fake-quant ``nn.Linear``, and an FP4 copy of a (LoRA-merged) transformer.

Hardware honesty. Real FP4 GEMMs need an sm_100+ GPU (Blackwell); torchao 0.18's W4A4 NVFP4 config asserts
sm100+. On CPU and on Hopper (H100/H200) this module is a numerics *simulator*: weights and activations are
rounded to FP4 and back, then an ordinary matmul runs in the input dtype, so it is slower than bf16. FP4 scouts
here measure **ranking fidelity only** (does the FP4 model rank a prompt's seeds like the full model?); FP4 speed
figures may only come from an sm_100+ device. Where one is present, real FP4 kernels (torchao
``NVFP4DynamicActivationNVFP4WeightConfig``, Transformer Engine) may replace this emulator; nothing here needs one.

Formats (E2M1 elements: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, round to nearest even, saturate at ±6;
OCP MX v1.0, torchao ``nvfp4_tensor.nvfp4_quantize`` / ``mx_tensor.to_mx``). Blocks run along the last dim:

- NVFP4, blocks of 16, FP8 E4M3 block scales, optional FP32 global scale s_T = amax/(448·6):
  s_B = e4m3(clamp(amax_block/6/s_T, 2⁻⁶, 448)),  x̃ = E2M1(clamp(x·(1/s_T)/s_B, −6, 6))·(s_T·s_B).
  ``global_scale``: "none" (s_T = 1, single level), "tensor" (one s_T for the whole tensor), "row" (one s_T
  per row of the last dim, i.e. per token; torchao's per-expert scale path with one "expert" per row).
- MXFP4 (OCP MX v1.0), blocks of 32, E8M0 power-of-two scales X = 2^e:
  "rceil" (torchao's MX config default) e = ⌈log2(amax_block/6)⌉; "floor" (OCP spec) e = ⌊log2 amax_block⌋ − 2;
  x̃ = X·E2M1(clamp(x/X, −6, 6)).

``fake_quantize`` returns exactly ``NVFP4Tensor.to_nvfp4(...).dequantize()`` / ``MXTensor.to_mx(...).dequantize()``
of torchao 0.18.0 on the input viewed as (rows, last dim); the one deliberate difference: where a global scale
would be 0 (an all-zero tensor or row) it is set to 1, so zeros come back as zeros where torchao returns NaN.
bf16 and fp32 go straight through torchao; fp16 is rounded through fp32. Inference only: no gradient flows.

FP4 linear: y = linear(Q_a(x), Q_w(W), b). W is quantized once, when the layer is built or refreshed (NVFP4
default: two-level, s_T from amax(W), torchao's weight recipe). Activation scales are block-local ("none") or
per row ("row"), never per tensor, so one sample's output does not depend on the rest of the batch (a
per-tensor activation scale, torchao's / TE's dynamic default, couples them).

Eligibility (``default_eligibility``): a module is swapped iff it is an ``nn.Linear`` (not the
``NonDynamicallyQuantizableLinear`` that ``nn.MultiheadAttention`` reads weights from directly), in_features is
a multiple of the block size (16 NVFP4, 32 MXFP4), max(in_features, out_features) > ``min_dim`` (Sol-RL's
small-layer rule; Sol-RL uses 1000–2432 on 1–12B models to skip layers too small to speed up) and its dotted
name matches none of the ``skip`` fnmatch patterns. Default skip: conditioning embedders ("*embed*"), the
final AdaLN/projection ("norm_out*", "proj_out") and peft adapters ("*lora_*"), as in Sol-RL's FLUX list; pass
``skip=()`` to quantize those too (a scout-fidelity measurement quantized all 60 layers of the toy model).
"""
from __future__ import annotations

import copy as _copy
import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["BLOCK_SIZE", "DEFAULT_SKIP", "FP4Linear", "FP4Spec", "default_eligibility", "fake_quantize",
           "fp4_copy", "quantized_names", "refresh_fp4_copy"]

BLOCK_SIZE = {"nvfp4": 16, "mxfp4": 32}
GLOBAL_SCALES = ("none", "tensor", "row")
MX_SCALING = ("rceil", "floor")
DEFAULT_SKIP = ("*embed*", "norm_out*", "proj_out", "*lora_*")
DEFAULT_MIN_DIM = 64


def _torchao():
    """(NVFP4Tensor, per_tensor_amax_to_scale, MXTensor, ScaleCalculationMode), imported lazily."""
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
    except ImportError as e:
        raise ImportError("FP4 fake quantisation needs torchao 0.18.0: pip install 'flowrl[fp4]'") from e
    return NVFP4Tensor, per_tensor_amax_to_scale, MXTensor, ScaleCalculationMode


def _check_format(fmt: str, global_scale: str, mx_scaling: str) -> None:
    if fmt not in BLOCK_SIZE:
        raise ValueError(f"fmt must be one of {sorted(BLOCK_SIZE)}, got {fmt!r}")
    if global_scale not in GLOBAL_SCALES:
        raise ValueError(f"global_scale must be one of {GLOBAL_SCALES}, got {global_scale!r}")
    if fmt == "mxfp4" and global_scale != "none":
        raise ValueError(f"global_scale must be 'none' for mxfp4 (E8M0 block scales only), got {global_scale!r}")
    if mx_scaling not in MX_SCALING:
        raise ValueError(f"mx_scaling must be one of {MX_SCALING}, got {mx_scaling!r}")


def _nonzero_scale(scale: Tensor) -> Tensor:
    """A global scale of 0 (all-zero tensor/row) would make torchao divide 0 by 0; any positive one gives 0s."""
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _nvfp4(x: Tensor, global_scale: str) -> Tensor:
    nvfp4_tensor, amax_to_scale, _, _ = _torchao()
    if global_scale == "none":
        return nvfp4_tensor.to_nvfp4(x, block_size=16).dequantize(x.dtype)
    if global_scale == "tensor":
        s = _nonzero_scale(amax_to_scale(torch.max(torch.abs(x))))
        return nvfp4_tensor.to_nvfp4(x, block_size=16, per_tensor_scale=s).dequantize(x.dtype)
    rows = x.unsqueeze(1)                                   # (M, 1, K): one per-"expert" scale per row
    s = _nonzero_scale(amax_to_scale(rows.abs().amax(dim=-1, keepdim=True)))
    return nvfp4_tensor.to_nvfp4(rows, block_size=16, per_tensor_scale=s).dequantize(x.dtype).squeeze(1)


def _mxfp4(x: Tensor, mx_scaling: str) -> Tensor:
    _, _, mx_tensor, mode = _torchao()
    scaling = mode.RCEIL if mx_scaling == "rceil" else mode.FLOOR
    return mx_tensor.to_mx(x, torch.float4_e2m1fn_x2, 32, scaling_mode=scaling).dequantize(x.dtype)


def fake_quantize(t: Tensor, fmt: str, *, global_scale: str = "none", mx_scaling: str = "rceil") -> Tensor:
    """FP4 quantize → dequantize of ``t`` along its last dim (module docstring); same shape and dtype."""
    _check_format(fmt, global_scale, mx_scaling)
    if not isinstance(t, Tensor) or t.dtype not in (torch.float32, torch.bfloat16, torch.float16) or t.dim() < 1:
        raise ValueError(f"fake_quantize: t must be a float32/bfloat16/float16 tensor with ≥ 1 dim, got "
                         f"{getattr(t, 'dtype', type(t))}")
    k = t.shape[-1]
    if k % BLOCK_SIZE[fmt]:
        raise ValueError(f"fake_quantize: the last dim ({k}) must be a multiple of the {fmt} block size "
                         f"{BLOCK_SIZE[fmt]}")
    if t.numel() == 0:
        return t.clone()
    x = t.detach().reshape(-1, k).contiguous()
    if x.dtype == torch.float16:
        x = x.float()
    out = _nvfp4(x, global_scale) if fmt == "nvfp4" else _mxfp4(x, mx_scaling)
    return out.to(t.dtype).reshape(t.shape)


@dataclass(frozen=True)
class FP4Spec:
    """How an FP4 linear quantizes: format, weight and activation global scales, MX scale rounding.

    ``weight_scale`` defaults to "tensor" for NVFP4 (torchao's weight recipe) and "none" for MXFP4;
    ``act_scale`` is "none" (block scales only) or "row" (NVFP4 per-token global scale) — never "tensor".
    """

    fmt: str = "nvfp4"
    weight_scale: str | None = None
    act_scale: str = "none"
    mx_scaling: str = "rceil"

    def __post_init__(self):
        if self.weight_scale is None:
            object.__setattr__(self, "weight_scale", "tensor" if self.fmt == "nvfp4" else "none")
        _check_format(self.fmt, self.weight_scale, self.mx_scaling)
        _check_format(self.fmt, self.act_scale, self.mx_scaling)
        if self.act_scale == "tensor":
            raise ValueError("act_scale must be 'none' or 'row': a per-tensor activation scale couples the samples "
                             "of a batch")

    @property
    def block_size(self) -> int:
        return BLOCK_SIZE[self.fmt]


class FP4Linear(nn.Module):
    """Fake-quant linear y = linear(Q_a(x), Q_w(W), b); Q_w(W) is stored (as ``weight``) and refreshed on demand."""

    def __init__(self, linear: nn.Linear, spec: FP4Spec):
        super().__init__()
        self.in_features, self.out_features, self.spec = linear.in_features, linear.out_features, spec
        w = linear.weight
        self.weight = nn.Parameter(torch.empty(w.shape, dtype=w.dtype, device=w.device), requires_grad=False)
        self.bias = None
        if linear.bias is not None:
            b = linear.bias
            self.bias = nn.Parameter(torch.empty(b.shape, dtype=b.dtype, device=b.device), requires_grad=False)
        self.refresh(linear)

    @torch.no_grad()
    def refresh(self, linear: nn.Module) -> None:
        """Re-quantize ``weight`` from ``linear.weight`` and copy its bias."""
        w = getattr(linear, "weight", None)
        if not isinstance(w, Tensor) or w.shape != self.weight.shape:
            raise ValueError(f"FP4Linear.refresh: source weight must have shape {tuple(self.weight.shape)}, got "
                             f"{getattr(w, 'shape', None)}")
        s = self.spec
        self.weight.copy_(fake_quantize(w.detach(), s.fmt, global_scale=s.weight_scale, mx_scaling=s.mx_scaling))
        if (self.bias is None) != (getattr(linear, "bias", None) is None):
            raise ValueError("FP4Linear.refresh: source and copy disagree on having a bias")
        if self.bias is not None:
            self.bias.copy_(linear.bias.detach())

    def forward(self, x: Tensor) -> Tensor:
        s = self.spec
        xq = fake_quantize(x, s.fmt, global_scale=s.act_scale, mx_scaling=s.mx_scaling)
        return F.linear(xq, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"fmt={self.spec.fmt}, weight_scale={self.spec.weight_scale}, act_scale={self.spec.act_scale}")


Eligibility = Callable[[str, nn.Module], bool]


def default_eligibility(fmt: str = "nvfp4", *, min_dim: int = DEFAULT_MIN_DIM,
                        skip: Sequence[str] = DEFAULT_SKIP) -> Eligibility:
    """The rule of the module docstring as a predicate ``(qualified name, module) -> bool``."""
    if fmt not in BLOCK_SIZE:
        raise ValueError(f"fmt must be one of {sorted(BLOCK_SIZE)}, got {fmt!r}")
    if not isinstance(min_dim, int) or min_dim < 0:
        raise ValueError(f"min_dim must be an int ≥ 0, got {min_dim!r}")
    block, patterns = BLOCK_SIZE[fmt], tuple(skip)

    def eligible(name: str, module: nn.Module) -> bool:
        return (isinstance(module, nn.Linear)
                and not isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear)
                and module.in_features % block == 0
                and max(module.in_features, module.out_features) > min_dim
                and not any(fnmatch.fnmatchcase(name, p) for p in patterns))
    return eligible


@torch.no_grad()
def fp4_copy(module: nn.Module, fmt: str = "nvfp4", eligible: Eligibility | None = None,
             **spec: str) -> nn.Module:
    """A deep copy of ``module`` whose eligible Linears are ``FP4Linear`` (the source is untouched).

    ``eligible(name, module)`` picks the layers (default: ``default_eligibility(fmt)``); ``spec`` holds the
    ``FP4Spec`` fields other than fmt. The copy has ``requires_grad=False`` everywhere. Layers are quantized
    while copying, so the eligible full-precision weights are never duplicated.
    """
    spec_ = FP4Spec(fmt, **spec)
    rule = eligible if eligible is not None else default_eligibility(fmt)
    memo: dict[int, object] = {}
    for name, m in module.named_modules():
        if not rule(name, m):
            continue
        if not isinstance(m, nn.Linear) or m.in_features % spec_.block_size:
            raise ValueError(f"fp4_copy: {name or 'the module'} is not an nn.Linear with in_features a multiple of "
                             f"{spec_.block_size}; fix the eligibility rule")
        memo[id(m)] = FP4Linear(m, spec_)
    if not memo:
        raise ValueError(f"fp4_copy: no eligible nn.Linear in {type(module).__name__} for {fmt}; loosen min_dim/skip")
    out = _copy.deepcopy(module, memo)
    return out.requires_grad_(False)


def quantized_names(module: nn.Module) -> list[str]:
    """Qualified names of the ``FP4Linear`` layers of a copy."""
    return [n for n, m in module.named_modules() if isinstance(m, FP4Linear)]


def _copy_direct_tensors(dst: nn.Module, src: nn.Module, name: str) -> None:
    for kind in ("named_parameters", "named_buffers"):
        src_t = dict(getattr(src, kind)(recurse=False))
        for tname, t in getattr(dst, kind)(recurse=False):
            s = src_t.get(tname)
            if s is None or s.shape != t.shape:
                raise ValueError(f"refresh_fp4_copy: source has no {name}.{tname} of shape {tuple(t.shape)}")
            t.copy_(s.detach())


@torch.no_grad()
def refresh_fp4_copy(copy: nn.Module, source: nn.Module) -> int:
    """Bring an ``fp4_copy`` up to date with ``source`` (same module names, e.g. after a new LoRA merge):
    FP4 layers re-quantize from the source weights, every other parameter and buffer is copied.
    Returns the number of re-quantized layers."""
    src = dict(source.named_modules())
    n = 0
    for name, m in copy.named_modules():
        if name not in src:
            raise ValueError(f"refresh_fp4_copy: source has no module {name!r}; pass the module the copy was made from")
        if isinstance(m, FP4Linear):
            m.refresh(src[name])
            n += 1
        else:
            _copy_direct_tensors(m, src[name], name)
    return n
