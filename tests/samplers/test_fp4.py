"""FP4 fake quantisation: torchao's round trip against the format equations, ours against torchao bit for bit,
the error bound, batch independence of the fake-quant linear, the eligibility rule and the refreshable copy."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("torchao")

from samplers.fp4 import (
    DEFAULT_SKIP,
    FP4Linear,
    FP4Spec,
    default_eligibility,
    fake_quantize,
    fp4_copy,
    quantized_names,
    refresh_fp4_copy,
)

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
CASES = [("nvfp4", "none", "rceil"), ("nvfp4", "tensor", "rceil"), ("mxfp4", "none", "rceil"),
         ("mxfp4", "none", "floor")]


def torchao_round_trip(x, fmt, scale, mode):
    """torchao 0.18's own quantize → dequantize on a 2-D tensor, called directly."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    if fmt == "mxfp4":
        m = ScaleCalculationMode.RCEIL if mode == "rceil" else ScaleCalculationMode.FLOOR
        return MXTensor.to_mx(x, torch.float4_e2m1fn_x2, 32, scaling_mode=m).dequantize(x.dtype)
    s = per_tensor_amax_to_scale(torch.max(torch.abs(x))) if scale == "tensor" else None
    return NVFP4Tensor.to_nvfp4(x, block_size=16, per_tensor_scale=s).dequantize(x.dtype)


def e2m1(a):
    """Round to the E2M1 grid, ties to even, saturating at ±6: steps 0.5 below 2, 1 in [2, 4), 2 in [4, 6]."""
    m = a.abs().clamp(max=6.0)
    q = torch.where(m < 2, torch.round(m * 2) / 2, torch.where(m < 4, torch.round(m), torch.round(m / 2) * 2))
    return torch.copysign(q, a)


def reference(x, fmt, scale, mode):
    """The NVFP4 / MXFP4 format equations in plain torch (no torchao); NVFP4 scales by the
    reciprocal x·((1/s_T)/s_B) as torchao's kernel comment says. Returns (x̃, block scale S (M, K/b))."""
    k = x.shape[-1]
    b = 16 if fmt == "nvfp4" else 32
    xb = x.float().reshape(x.shape[0], k // b, b)
    amax = xb.abs().amax(-1)
    if fmt == "nvfp4":
        s_t = amax.max() / (448.0 * 6.0) if scale == "tensor" else torch.tensor(1.0)
        s_b = (amax / 6.0 / s_t if scale == "tensor" else amax / 6.0).clamp(2.0 ** -6, 448.0)
        s_b = s_b.to(torch.float8_e4m3fn).float()
        y = xb * ((1.0 / s_t) / s_b if scale == "tensor" else 1.0 / s_b).unsqueeze(-1)
        big_s = s_t * s_b if scale == "tensor" else s_b
    else:
        e = torch.ceil(torch.log2(amax / 6.0)) if mode == "rceil" else (torch.frexp(amax).exponent - 3).float()
        big_s = torch.exp2(e.clamp(-127, 127))
        y = xb / big_s.unsqueeze(-1)
    q = e2m1(y.clamp(-6.0, 6.0))
    return (q * big_s.unsqueeze(-1)).reshape(x.shape).to(x.dtype), big_s


def awkward(m=12, k=128, seed=0, dtype=torch.float32):
    """Gaussian rows with blocks far above and below the scale ranges, a zero block and exact ties."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[1, :32] *= 1e3                                         # NVFP4 single-level scale saturates at 448
    x[2, 32:64] *= 1e-4                                      # below the E4M3 scale floor 2⁻⁶
    x[3, 64:96] = 0.0
    x[4, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2)  # E2M1 ties, block amax 6
    return x.to(dtype)


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt,scale,mode", CASES)
def test_torchao_round_trip_equals_the_format_equations(fmt, scale, mode, dtype):
    x = awkward(dtype=dtype)
    want, _ = reference(x, fmt, scale, mode)
    assert torch.equal(bits(torchao_round_trip(x, fmt, scale, mode)), bits(want))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt,scale,mode", CASES)
def test_fake_quantize_is_torchaos_round_trip_bit_for_bit(fmt, scale, mode, dtype):
    x = awkward(dtype=dtype)
    got = fake_quantize(x, fmt, global_scale=scale, mx_scaling=mode)
    assert got.dtype == dtype and torch.equal(bits(got), bits(torchao_round_trip(x, fmt, scale, mode)))
    x4 = torch.randn(2, 3, 4, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = fake_quantize(x4, fmt, global_scale=scale, mx_scaling=mode)
    want = torchao_round_trip(x4.reshape(-1, 64), fmt, scale, mode).reshape(x4.shape)
    assert torch.equal(bits(got), bits(want))


def test_row_global_scale_is_the_tensor_scale_of_each_row():
    x = awkward()
    got = fake_quantize(x, "nvfp4", global_scale="row")
    for i in range(x.shape[0]):
        if x[i].abs().max() > 0:
            assert torch.equal(got[i:i + 1], torchao_round_trip(x[i:i + 1], "nvfp4", "tensor", None))


def test_all_zero_input_comes_back_zero_where_torchao_returns_nan():
    z = torch.zeros(2, 64)
    assert torch.isnan(torchao_round_trip(z, "nvfp4", "tensor", None)).all()
    for fmt, scale, mode in [*CASES, ("nvfp4", "row", "rceil")]:
        assert torch.equal(fake_quantize(z, fmt, global_scale=scale, mx_scaling=mode), z)
    assert torch.equal(fake_quantize(torch.zeros(0, 32), "mxfp4"), torch.zeros(0, 32))


def test_float16_rounds_through_float32():
    x = torch.randn(4, 64).half()
    assert torch.equal(fake_quantize(x, "nvfp4"), fake_quantize(x.float(), "nvfp4").half())


@pytest.mark.parametrize("fmt,scale,mode", CASES)
def test_values_lie_on_the_grid_within_the_rounding_bound(fmt, scale, mode):
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(2))
    out = fake_quantize(x, fmt, global_scale=scale, mx_scaling=mode)
    _, big_s = reference(x, fmt, scale, mode)
    b = 16 if fmt == "nvfp4" else 32
    s = big_s.repeat_interleave(b, dim=-1)
    q = (out / s).abs()                                         # q·S was rounded once in fp32 (two-level S)
    nearest = E2M1_GRID[(q.unsqueeze(-1) - E2M1_GRID).abs().argmin(-1)]
    assert torch.allclose(q, nearest, rtol=2 ** -23, atol=0)
    a = (x / s).abs()
    half_step = torch.where(a < 2, 0.25, torch.where(a < 4, 0.5, 1.0))
    bound = s * half_step + (x.abs() - 6 * s).clamp_min(0)
    assert ((x - out).abs() <= bound * (1 + 1e-6)).all()
    amax = x.reshape(64, -1, b).abs().amax(-1)
    if fmt == "mxfp4" and mode == "rceil":                     # X = 2^⌈log2(amax/6)⌉ ∈ [amax/6, amax/3)
        assert ((big_s >= amax / 6) & (big_s < amax / 3)).all()
    elif fmt == "mxfp4":                                        # X = 2^(⌊log2 amax⌋ − 2) ∈ (amax/8, amax/4]
        assert ((big_s > amax / 8) & (big_s <= amax / 4)).all()
    else:                                                       # S = e4m3(amax/6): 3 mantissa bits
        assert torch.allclose(big_s, amax / 6, rtol=2 ** -4, atol=0)


def sqnr_db(x, y):
    return (10 * torch.log10(x.pow(2).sum() / (x - y).pow(2).sum())).item()


def test_gaussian_sqnr_matches_the_formats_and_nvfp4_beats_mxfp4():
    x = torch.randn(256, 1024, generator=torch.Generator().manual_seed(0))
    nv = [sqnr_db(x, fake_quantize(x, "nvfp4", global_scale=s)) for s in ("none", "tensor", "row")]
    mx = [sqnr_db(x, fake_quantize(x, "mxfp4", mx_scaling=m)) for m in ("rceil", "floor")]
    assert all(19.5 < v < 21.5 for v in nv), nv                # measured 20.4 dB
    assert all(17.5 < v < 20.0 for v in mx), mx                # measured 18.7–18.8 dB
    assert min(nv) > max(mx)


@pytest.mark.parametrize("bad", [
    lambda: fake_quantize(torch.randn(4, 40), "nvfp4"),
    lambda: fake_quantize(torch.randn(4, 48), "mxfp4"),
    lambda: fake_quantize(torch.randn(4, 64), "int4"),
    lambda: fake_quantize(torch.randn(4, 64), "mxfp4", global_scale="tensor"),
    lambda: fake_quantize(torch.randn(4, 64), "nvfp4", global_scale="batch"),
    lambda: fake_quantize(torch.randn(4, 64), "mxfp4", mx_scaling="even"),
    lambda: fake_quantize(torch.arange(64), "nvfp4"),
    lambda: FP4Spec("nvfp4", act_scale="tensor"),
    lambda: FP4Spec("mxfp4", weight_scale="tensor"),
    lambda: default_eligibility("fp8"),
])
def test_bad_input_is_a_value_error(bad):
    with pytest.raises(ValueError):
        bad()


SPECS = [FP4Spec("nvfp4"), FP4Spec("nvfp4", weight_scale="none", act_scale="row"), FP4Spec("mxfp4"),
         FP4Spec("mxfp4", mx_scaling="floor")]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.fmt}-{s.weight_scale}-{s.act_scale}-{s.mx_scaling}")
def test_fp4_linear_is_a_linear_of_fake_quantized_operands(spec):
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    layer = FP4Linear(lin, spec)
    x = torch.randn(2, 5, 64)
    w = fake_quantize(lin.weight.detach(), spec.fmt, global_scale=spec.weight_scale, mx_scaling=spec.mx_scaling)
    xq = fake_quantize(x, spec.fmt, global_scale=spec.act_scale, mx_scaling=spec.mx_scaling)
    assert torch.equal(layer(x), F.linear(xq, w, lin.bias))
    assert not torch.equal(w, lin.weight) and layer.weight.requires_grad is False


def test_fp4_linear_in_bfloat16_without_bias():
    lin = nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    layer = FP4Linear(lin, FP4Spec("nvfp4"))
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    w = fake_quantize(lin.weight.detach(), "nvfp4", global_scale="tensor")
    y = layer(x)
    assert y.dtype == torch.bfloat16 and layer.bias is None
    assert torch.equal(y, F.linear(fake_quantize(x, "nvfp4"), w))
    with pytest.raises(ValueError, match="bias"):
        layer.refresh(nn.Linear(64, 32).to(torch.bfloat16))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.fmt}-{s.weight_scale}-{s.act_scale}-{s.mx_scaling}")
def test_fp4_linear_sample_output_does_not_depend_on_its_batch(spec):
    torch.manual_seed(1)
    layer = FP4Linear(nn.Linear(64, 32), spec)
    x = torch.randn(6, 7, 64)
    other = x.clone()
    other[1:] = torch.randn(5, 7, 64) * 50                     # different, outlier-heavy companions
    assert torch.equal(layer(x)[0], layer(other)[0])           # same batch shape: bit for bit
    act = fake_quantize(x, spec.fmt, global_scale=spec.act_scale, mx_scaling=spec.mx_scaling)
    assert torch.equal(act[:1], fake_quantize(x[:1], spec.fmt, global_scale=spec.act_scale,
                                              mx_scaling=spec.mx_scaling))
    assert torch.allclose(layer(x[:1]), layer(x)[:1], rtol=1e-5, atol=1e-5)   # matmul blocking may differ by M
    coupled = [F.linear(fake_quantize(t, "nvfp4", global_scale="tensor"), layer.weight, layer.bias)[0]
               for t in (x, other)]
    assert not torch.equal(*coupled)                            # a per-tensor activation scale would couple them


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.to_q = nn.Linear(64, 128)
        self.to_k = nn.Linear(64, 64)                           # max(in, out) = 64: tiny under min_dim 64
        self.ff = nn.Linear(48, 128, bias=False)                # 48: a multiple of 16, not of 32
        self.small = nn.Linear(32, 32)
        self.proj_out = nn.Linear(64, 128)                      # a block's proj_out is not the final one
        self.lora_A = nn.Linear(64, 128)
        self.mha = nn.MultiheadAttention(64, 2)                 # out_proj is a NonDynamicallyQuantizableLinear


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.x_embedder = nn.Linear(64, 64)
        self.blocks = nn.ModuleList([Blocks()])
        self.norm = nn.LayerNorm(64)
        self.norm_out = nn.Sequential(nn.Linear(64, 128))
        self.proj_out = nn.Linear(64, 16)

    def forward(self, x):
        b = self.blocks[0]
        h = self.x_embedder(x)
        h = self.norm(h + b.proj_out(b.to_q(h)[..., :64] + b.to_k(h))[..., :64])
        return self.proj_out(h * self.norm_out(h)[..., :64])


def eligible_names(net, rule):
    return {n for n, m in net.named_modules() if rule(n, m)}


def test_eligibility_rule():
    net = Net()
    assert eligible_names(net, default_eligibility("nvfp4")) == {"blocks.0.to_q", "blocks.0.ff", "blocks.0.proj_out"}
    assert eligible_names(net, default_eligibility("mxfp4")) == {"blocks.0.to_q", "blocks.0.proj_out"}
    everything = {"x_embedder", "blocks.0.to_q", "blocks.0.to_k", "blocks.0.ff", "blocks.0.proj_out",
                  "blocks.0.lora_A", "norm_out.0", "proj_out", "blocks.0.small"}
    assert eligible_names(net, default_eligibility("nvfp4", min_dim=0, skip=())) == everything
    assert eligible_names(net, default_eligibility("nvfp4", min_dim=0, skip=DEFAULT_SKIP[:1])) == everything - {
        "x_embedder"}
    assert eligible_names(net, default_eligibility("nvfp4", skip=())) == everything - {
        "x_embedder", "blocks.0.to_k", "proj_out", "blocks.0.small"}
    with pytest.raises(ValueError, match="blocks.0.ff"):
        fp4_copy(net, "mxfp4", eligible=lambda n, m: isinstance(m, nn.Linear))
    with pytest.raises(ValueError, match="no eligible"):
        fp4_copy(nn.Sequential(nn.Linear(8, 8)), "nvfp4")


def test_fp4_copy_leaves_the_source_alone_and_shares_no_storage():
    torch.manual_seed(0)
    net = Net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    cp = fp4_copy(net, "nvfp4")
    assert set(quantized_names(cp)) == {"blocks.0.to_q", "blocks.0.ff", "blocks.0.proj_out"}
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert type(net.blocks[0].to_q) is nn.Linear
    src_ptrs = {p.data_ptr() for p in net.parameters()}
    assert not src_ptrs & {p.data_ptr() for p in cp.parameters()}
    assert not any(p.requires_grad for p in cp.parameters())
    assert torch.equal(cp.x_embedder.weight, net.x_embedder.weight)          # skipped layers: plain copies
    x = torch.randn(3, 64)
    y, yq = net(x), cp(x)
    assert not torch.equal(y, yq) and sqnr_db(y, yq) > 10


def perturb_(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_refresh_requantizes_from_the_updated_source(fmt):
    torch.manual_seed(0)
    net = Net()
    rule = default_eligibility(fmt, min_dim=0, skip=())
    cp = fp4_copy(net, fmt, rule)
    perturb_(net, 1)                                           # e.g. a new LoRA merge, norms and embedders too
    fresh = fp4_copy(net, fmt, rule)
    x = torch.randn(3, 64)
    assert not torch.equal(cp(x), fresh(x))
    assert refresh_fp4_copy(cp, net) == len(quantized_names(fresh))
    for (k, v), (k2, v2) in zip(cp.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2), k
    assert torch.equal(cp(x), fresh(x))
    with pytest.raises(ValueError, match="no module"):
        refresh_fp4_copy(cp, nn.Sequential(nn.Linear(64, 64)))


def tiny_sd3():
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    return SD3Transformer2DModel(sample_size=16, patch_size=4, in_channels=4, out_channels=4, num_layers=2,
                                 attention_head_dim=32, num_attention_heads=3, joint_attention_dim=32,
                                 caption_projection_dim=96, pooled_projection_dim=32, pos_embed_max_size=8).eval()


def sd3_velocity(model, x, ctx, pooled, t):
    return model(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=pooled, timestep=t,
                 return_dict=False)[0]


def test_fp4_copy_of_a_diffusers_transformer_keeps_samples_independent():
    model = tiny_sd3()
    cp = fp4_copy(model, "nvfp4")
    names = set(quantized_names(cp))
    assert "transformer_blocks.0.attn.to_q" in names and "transformer_blocks.1.ff.net.2" in names
    assert not names & {"context_embedder", "proj_out", "norm_out.linear", "time_text_embed.text_embedder.linear_1"}
    g = torch.Generator().manual_seed(0)
    x, ctx = torch.randn(3, 4, 16, 16, generator=g), torch.randn(3, 6, 32, generator=g)
    pooled, t = torch.randn(3, 32, generator=g), torch.tensor([500.0, 250.0, 900.0])
    with torch.no_grad():
        v, vq = sd3_velocity(model, x, ctx, pooled, t), sd3_velocity(cp, x, ctx, pooled, t)
        x2, ctx2 = x.clone(), ctx.clone()
        x2[1:], ctx2[1:] = 30 * torch.randn(2, 4, 16, 16, generator=g), 30 * torch.randn(2, 6, 32, generator=g)
        vq2 = sd3_velocity(cp, x2, ctx2, pooled, t)
    assert vq.shape == v.shape and sqnr_db(v, vq) > 8
    assert torch.equal(vq[0], vq2[0])                          # sample 0 ignores its batch companions
