"""flashjit.attention on CUDA torch tensors against an fp64 reference computed with torch SDPA's
math backend: fresh random inputs, odd seqlens, GQA/MQA, both layouts, causal with
seqlen_q != seqlen_k; plus streams, the caller's current device, device mismatches.
Skips without torch + CUDA (fails instead with FLASHJIT_EXPECT_GPU=1)."""
import numpy as np
import pytest

import flashjit
from conftest import require_gpu, seed

MAX_REL = 1e-2
MAX_LSE = 1e-3


def torch_modules():
    require_gpu()
    import torch
    import torch.nn.functional as F

    return torch, F


def to_bhsd(x, layout):
    return x.transpose(1, 2) if layout == "bshd" else x


def sdpa_reference(q, k, v, causal=False, scale=None, layout="bshd"):
    """(o in `layout`, lse (batch, heads_q, seqlen_q)) in fp64, through torch SDPA's math backend:
    k/v heads repeated for GQA, an explicit bottom-right causal mask; rows that see no key get
    o = 0 and lse = +inf (the library's convention; SDPA itself gives NaN there)."""
    torch, F = torch_modules()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (to_bhsd(x.detach().double(), layout) for x in (q, k, v))
    heads_q, heads_kv = q.shape[1], k.shape[1]
    if heads_q != heads_kv:
        k = k.repeat_interleave(heads_q // heads_kv, dim=1)
        v = v.repeat_interleave(heads_q // heads_kv, dim=1)
    seqlen_q, seqlen_k, head_dim = q.shape[2], k.shape[2], q.shape[3]
    scale = head_dim ** -0.5 if scale is None else scale
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device)
    if causal:
        i = torch.arange(seqlen_q, device=q.device)[:, None]
        j = torch.arange(seqlen_k, device=q.device)[None, :]
        visible = j <= i + seqlen_k - seqlen_q
    with sdpa_kernel([SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=visible if causal else None,
                                           scale=scale)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    lse = torch.logsumexp(scores.masked_fill(~visible, float("-inf")), dim=-1)
    empty = ~visible.any(dim=-1)
    o[:, :, empty, :] = 0
    lse[:, :, empty] = float("inf")
    return (o.transpose(1, 2) if layout == "bshd" else o), lse


def relative_error(out, ref):
    torch, _ = torch_modules()
    out = out.double()
    assert not torch.isnan(out).any(), "NaN in the output"
    assert torch.isfinite(out).all(), "inf in the output"
    return (torch.linalg.norm(out - ref) / torch.linalg.norm(ref).clamp_min(1e-300)).item()


def lse_error(lse, ref):
    torch, _ = torch_modules()
    assert not torch.isnan(lse).any(), "NaN in the lse"
    infinite = torch.isinf(ref)
    assert torch.equal(torch.isposinf(lse), infinite), "lse: +inf rows differ"
    if (~infinite).any():
        return (lse.double()[~infinite] - ref[~infinite]).abs().max().item()
    return 0.0


def shape(layout, batch, seqlen, heads, head_dim):
    if layout == "bshd":
        return (batch, seqlen, heads, head_dim)
    return (batch, heads, seqlen, head_dim)


def randn(shape_, dtype, device="cuda", generator=None):
    torch, _ = torch_modules()
    return torch.randn(shape_, dtype=torch.float32, device=device, generator=generator).to(dtype)


CASES = [
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
    (1, 1, 1, 2, 2, 64),
    (2, 17, 17, 8, 2, 128),     # GQA
    (1, 1000, 1000, 4, 1, 64),  # MQA
    (2, 17, 300, 4, 4, 128),    # seqlen_q < seqlen_k
    (1, 300, 17, 4, 2, 256),    # seqlen_q > seqlen_k: causal rows without keys
    (2, 1000, 999, 2, 2, 256),
]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B%d-q%d-k%d-h%d/%d-d%d" % c)
def test_cuda_matches_sdpa_fp64(case, dtype_name, causal, layout):
    torch, _ = torch_modules()
    dtype = getattr(torch, dtype_name)
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = case
    generator = torch.Generator(device="cuda").manual_seed(seed(case, dtype_name, causal, layout))
    q = randn(shape(layout, batch, seqlen_q, heads_q, head_dim), dtype, generator=generator)
    k = randn(shape(layout, batch, seqlen_k, heads_kv, head_dim), dtype, generator=generator)
    v = randn(shape(layout, batch, seqlen_k, heads_kv, head_dim), dtype, generator=generator)
    out = torch.full_like(q, float("nan"))  # poisoned
    lse = torch.full((batch, heads_q, seqlen_q), float("nan"), device="cuda")
    result, result_lse = flashjit.attention(q, k, v, causal=causal, layout=layout, out=out,
                                            lse=lse, return_lse=True)
    assert result is out and result_lse is lse
    torch.cuda.synchronize()
    ref, ref_lse = sdpa_reference(q, k, v, causal=causal, layout=layout)
    assert relative_error(out, ref) < MAX_REL
    assert lse_error(lse, ref_lse) < MAX_LSE


def test_allocated_output_and_lse():
    torch, _ = torch_modules()
    q = randn((2, 77, 8, 128), torch.bfloat16)
    k = randn((2, 90, 2, 128), torch.bfloat16)
    v = randn((2, 90, 2, 128), torch.bfloat16)
    out, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
    assert out.device == q.device and out.dtype == q.dtype and out.shape == q.shape
    assert out.is_contiguous() and lse.dtype == torch.float32 and lse.shape == (2, 8, 77)
    ref, ref_lse = sdpa_reference(q, k, v, causal=True)
    assert relative_error(out, ref) < MAX_REL
    assert lse_error(lse, ref_lse) < MAX_LSE


def test_views_of_the_other_layout_and_scale():
    """BSHD views of BHSD tensors (what SDPA users hold) and BHSD views of BSHD ones: any strides
    with a contiguous last axis, no copies."""
    torch, _ = torch_modules()
    q = randn((2, 8, 129, 64), torch.float16)  # BHSD storage
    k = randn((2, 4, 70, 64), torch.float16)
    v = randn((2, 4, 70, 64), torch.float16)
    bshd = [x.transpose(1, 2) for x in (q, k, v)]
    out = flashjit.attention(*bshd, causal=True, scale=0.2, layout="bshd")
    ref, _ = sdpa_reference(*bshd, causal=True, scale=0.2, layout="bshd")
    assert relative_error(out, ref) < MAX_REL
    out = flashjit.attention(*[x.transpose(1, 2) for x in bshd], causal=True, scale=0.2,
                             layout="bhsd")
    ref, _ = sdpa_reference(q, k, v, causal=True, scale=0.2, layout="bhsd")
    assert relative_error(out, ref) < MAX_REL


def test_inputs_requiring_grad():
    torch, _ = torch_modules()
    q, k, v = (randn((1, 64, 4, 64), torch.bfloat16).requires_grad_() for _ in range(3))
    out = flashjit.attention(q, k, v)
    assert out.requires_grad  # differentiable (tests/python/test_torch_gpu.py)
    ref, _ = sdpa_reference(q, k, v)
    assert relative_error(out.detach(), ref) < MAX_REL


def _busy(torch, stream):
    """Keeps `stream` busy for tens of milliseconds."""
    with torch.cuda.stream(stream):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000_000)
        else:
            a = torch.randn(4096, 4096, device="cuda")
            for _ in range(20):
                a = a @ a
                a /= a.norm()


@pytest.mark.parametrize("how", ["current", "argument"])
def test_runs_on_the_callers_stream(how):
    """Inputs are written on a side stream after a long busy kernel; flashjit must run on that
    stream (torch's current one, or the stream= argument) to read them: on any other stream it
    would read the zeros that were there before."""
    torch, _ = torch_modules()
    sources = [randn((2, 500, 8, 128), torch.bfloat16) for _ in range(3)]
    ref, _ = sdpa_reference(*sources, causal=True)
    q, k, v = (torch.zeros_like(x) for x in sources)
    out = torch.zeros_like(q)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    _busy(torch, side)
    with torch.cuda.stream(side):
        for dst, src in zip((q, k, v), sources):
            dst.copy_(src)
        if how == "current":
            flashjit.attention(q, k, v, causal=True, out=out)
    if how == "argument":
        flashjit.attention(q, k, v, causal=True, out=out, stream=side)
    side.synchronize()
    assert relative_error(out, ref) < MAX_REL


def test_keeps_the_callers_current_device():
    torch, _ = torch_modules()
    count = torch.cuda.device_count()
    target = count - 1  # another device where there is one
    before = torch.cuda.current_device()
    q, k, v = (randn((1, 33, 2, 64), torch.float16, device=f"cuda:{target}") for _ in range(3))
    out = flashjit.attention(q, k, v)
    assert torch.cuda.current_device() == before
    assert out.device == q.device
    ref, _ = sdpa_reference(q, k, v)
    assert relative_error(out, ref) < MAX_REL
    assert flashjit.config_for(q, k, v)["device"] == f"cuda:{target}"


def test_device_mismatch():
    torch, _ = torch_modules()
    q = randn((1, 17, 2, 64), torch.float16)
    k_host = np.zeros((1, 17, 2, 64), np.float16)
    with pytest.raises(flashjit.InvalidArgumentError,
                       match="device mismatch: q is on cuda:0 but k is on cpu"):
        flashjit.attention(q, k_host, q)
    with pytest.raises(flashjit.InvalidArgumentError, match="but out is on cpu"):
        flashjit.attention(q, q, q, out=torch.empty(q.shape, dtype=q.dtype))
    if torch.cuda.device_count() > 1:
        k = q.to("cuda:1")
        with pytest.raises(flashjit.InvalidArgumentError,
                           match="device mismatch: q is on cuda:0 but k is on cuda:1"):
            flashjit.attention(q, k, k)


def test_default_and_given_configs():
    torch, _ = torch_modules()
    q, k, v = (randn((2, 300, 4, 128), torch.bfloat16) for _ in range(3))
    default = flashjit.config_for(q, k, v, causal=True, config="default")
    assert default["source"] == "default" and default["device"] == "cuda:0"
    ref, _ = sdpa_reference(q, k, v, causal=True)
    out = flashjit.attention(q, k, v, causal=True, config="default")
    assert relative_error(out, ref) < MAX_REL
    given = flashjit.attention(q, k, v, causal=True, config=default["config"])
    assert torch.equal(given, out)
    with pytest.raises(flashjit.InvalidArgumentError, match="is not legal"):
        flashjit.attention(q, k, v, config="m512n512w16s4")


def test_show_on_the_device():
    torch_modules()
    source = flashjit.show(head_dim=128, causal=True, device="cuda:0")
    assert "| cuda:0 " in source.splitlines()[0] and "__global__" in source
