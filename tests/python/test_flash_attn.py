"""flashjit.flash_attn (issue 32): flash_attn's flash_attn_func, flash_attn_varlen_func (and the
packed forms) and flash_attn_with_kvcache on flashjit, against an fp64 reference written in
flash_attn's own semantics (bottom-right causal and window, softcap, ALiBi as
-slope * |i + seqlen_k - seqlen_q - j|, lse layouts (batch, heads, seqlen_q) / (heads, total_q))
and torch SDPA: odd lengths (1, 17, 33), GQA, packed documents with 1-row documents, a paged
varlen call, windows, softcap, ALiBi, KV-cache appends into contiguous and paged caches (decode
and the gathered path), gradients through autograd, and the typed errors of what flashjit does
not do. float32 on the CPU backend; the same cases in bfloat16 on CUDA (skips without a GPU:
`pytest tests/python/test_flash_attn.py -k cuda`)."""
import math

import pytest

import flashjit
from conftest import have_module, require_cpu_backward, require_gpu, seed

if not have_module("torch"):
    pytest.skip("torch is not installed", allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from flashjit.flash_attn import (  # noqa: E402
    flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
    flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)

# Relative L2 error against fp64: out and lse (absolute), gradients.
TOLERANCE = {torch.float32: (2e-5, 1e-4, 1e-4), torch.bfloat16: (2e-2, 3e-2, 3e-2)}

DEVICES = [pytest.param("cpu", torch.float32, id="cpu"),
           pytest.param("cuda", torch.bfloat16, id="cuda")]


def setup_device(device):
    if device == "cuda":
        require_gpu()
    else:
        require_cpu_backward()


def randn(generator, *shape, dtype, device, grad=False):
    x = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype=dtype,
                                                                          device=device)
    return x.requires_grad_() if grad else x


def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None):
    """fp64 (o, lse) of one batch in flash_attn's semantics, differentiable: q (b, sq, h, d),
    k, v (b, sk, hkv, d); rows that see no key: o = 0, lse = +inf."""
    q, k, v = (x.double() for x in (q, k, v))
    sq, sk, h, d = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    k = k.repeat_interleave(h // k.shape[2], dim=2)
    v = v.repeat_interleave(h // v.shape[2], dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * (d ** -0.5 if scale is None else scale)
    i = torch.arange(sq, device=q.device)[:, None] + sk - sq  # query i's diagonal key
    j = torch.arange(sk, device=q.device)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    left, right = window
    right = 0 if causal else right
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        s = s - alibi.double()[:, None, None] * (i - j).abs()
    # A finite mask value keeps rows without keys free of NaN (their p is zeroed below).
    s = s.masked_fill(~visible, -1e30)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).masked_fill(~visible, 0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return o, lse.masked_fill(~visible.any(dim=-1), math.inf)


def rel(out, ref):
    """||out - ref|| / ||ref||, the denominator at least 1e-3 per element in RMS: a gradient that
    is exactly 0 in fp64 (one key: softmax is 1, so dq = 0) comes out as rounding noise (~1e-8)
    from any fp32 kernel, which is no error."""
    out = out.detach().double()
    assert torch.isfinite(out).all(), "NaN or inf"
    floor = 1e-3 * ref.numel() ** 0.5
    return ((out - ref).norm() / ref.norm().clamp_min(floor)).item()


def lse_diff(lse, ref):
    lse = lse.detach().double()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isposinf(lse), ~finite), "rows without keys must be +inf"
    return (lse[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0


# --- flash_attn_func ---------------------------------------------------------------------------

FUNC_CASES = [
    # (seqlen_q, seqlen_k, heads, heads_kv, causal, window, softcap, alibi)
    (1, 1, 4, 4, False, (-1, -1), 0.0, False),
    (17, 17, 8, 2, True, (-1, -1), 0.0, False),
    (17, 33, 6, 3, True, (-1, -1), 0.0, True),
    (33, 17, 4, 1, False, (5, 3), 0.0, False),
    (17, 17, 4, 2, True, (4, 0), 30.0, False),
    (1, 33, 8, 2, False, (-1, -1), 5.0, False),
]


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("case", FUNC_CASES, ids=lambda c: "-".join(map(str, c)))
def test_func_matches_the_reference(device, dtype, case):
    setup_device(device)
    sq, sk, h, hkv, causal, window, softcap, alibi = case
    g = torch.Generator().manual_seed(seed("func", case))
    q = randn(g, 2, sq, h, 64, dtype=dtype, device=device, grad=True)
    k = randn(g, 2, sk, hkv, 64, dtype=dtype, device=device, grad=True)
    v = randn(g, 2, sk, hkv, 64, dtype=dtype, device=device, grad=True)
    do = randn(g, 2, sq, h, 64, dtype=dtype, device=device)
    slopes = (torch.rand(h, generator=g) * 0.5 + 0.05).to(device) if alibi else None
    out, lse, probs = flash_attn_func(q, k, v, causal=causal, window_size=window,
                                      softcap=softcap, alibi_slopes=slopes,
                                      return_attn_probs=True)
    assert probs is None and lse.dtype == torch.float32 and lse.shape == (2, h, sq)
    assert out.shape == q.shape and out.dtype == dtype
    ref_o, ref_lse = reference(q, k, v, causal, window, softcap, slopes)
    o_tol, lse_tol, grad_tol = TOLERANCE[dtype]
    assert rel(out, ref_o) < o_tol
    assert lse_diff(lse, ref_lse) < lse_tol
    (out * do).sum().backward()
    refs = torch.autograd.grad((ref_o * do.double()).sum(), (q, k, v))
    for name, x, ref in zip("qkv", (q, k, v), refs):
        assert x.grad.shape == x.shape, name
        assert rel(x.grad, ref) < grad_tol, f"d{name}"


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_func_matches_torch_sdpa(device, dtype):
    setup_device(device)
    g = torch.Generator().manual_seed(seed("sdpa"))
    q = randn(g, 3, 17, 8, 64, dtype=dtype, device=device)
    k = randn(g, 3, 17, 2, 64, dtype=dtype, device=device)
    v = randn(g, 3, 17, 2, 64, dtype=dtype, device=device)
    for causal in (False, True):
        out = flash_attn_func(q, k, v, causal=causal, softmax_scale=0.3)
        expected = F.scaled_dot_product_attention(
            q.transpose(1, 2).double(), k.transpose(1, 2).double(), v.transpose(1, 2).double(),
            is_causal=causal, scale=0.3, enable_gqa=True).transpose(1, 2)
        assert rel(out, expected) < TOLERANCE[dtype][0]


def test_packed_forms_are_the_unpacked_calls():
    require_cpu_backward()
    g = torch.Generator().manual_seed(seed("packed"))
    qkv = randn(g, 2, 17, 3, 4, 64, dtype=torch.float32, device="cpu", grad=True)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = (qkv[:, :, i].detach() for i in range(3))
    assert torch.equal(out, flash_attn_func(q, k, v, causal=True))
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape and torch.isfinite(qkv.grad).all()
    kv = torch.stack((k, v), dim=2)
    assert torch.equal(flash_attn_kvpacked_func(q, kv, causal=True), out.detach())
    packed = qkv.detach().reshape(34, 3, 4, 64)
    cu = torch.tensor([0, 17, 34], dtype=torch.int32)
    varlen = flash_attn_varlen_qkvpacked_func(packed, cu, 17, causal=True)
    assert rel(varlen, out.detach().reshape(34, 4, 64).double()) < 1e-6


# --- flash_attn_varlen_func --------------------------------------------------------------------

def offsets(lengths, device):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def reference_documents(q, k, v, q_lengths, k_lengths, **variant):
    """fp64 (o (total_q, h, d), lse (h, total_q)) of each document alone."""
    outs, lses = [], []
    qs, ks = offsets(q_lengths, "cpu").tolist(), offsets(k_lengths, "cpu").tolist()
    for b in range(len(q_lengths)):
        o, lse = reference(q[None, qs[b]:qs[b + 1]], k[None, ks[b]:ks[b + 1]],
                           v[None, ks[b]:ks[b + 1]], **variant)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


VARLEN_CASES = [
    # (q lengths, k lengths, heads, heads_kv, causal, window, softcap, alibi)
    ((1, 17, 5, 1, 40), (1, 17, 5, 1, 40), 8, 2, True, (-1, -1), 0.0, False),
    ((3, 1, 17), (9, 1, 33), 4, 4, False, (-1, -1), 0.0, False),
    ((17, 1, 20), (17, 4, 25), 6, 2, True, (6, 0), 20.0, True),
]


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"{len(c[0])}docs-{c[4]}-{c[5]}")
def test_varlen_matches_each_document(device, dtype, case):
    setup_device(device)
    q_lengths, k_lengths, h, hkv, causal, window, softcap, alibi = case
    g = torch.Generator().manual_seed(seed("varlen", case))
    q = randn(g, sum(q_lengths), h, 64, dtype=dtype, device=device, grad=True)
    k = randn(g, sum(k_lengths), hkv, 64, dtype=dtype, device=device, grad=True)
    v = randn(g, sum(k_lengths), hkv, 64, dtype=dtype, device=device, grad=True)
    do = randn(g, sum(q_lengths), h, 64, dtype=dtype, device=device)
    slopes = (torch.rand(h, generator=g) * 0.5 + 0.05).to(device) if alibi else None
    variant = dict(causal=causal, window=window, softcap=softcap, alibi=slopes)
    out, lse, probs = flash_attn_varlen_func(
        q, k, v, offsets(q_lengths, device), offsets(k_lengths, device), max(q_lengths),
        max(k_lengths), causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes,
        return_attn_probs=True)
    assert probs is None and lse.shape == (h, sum(q_lengths))
    ref_o, ref_lse = reference_documents(q, k, v, q_lengths, k_lengths, **variant)
    o_tol, lse_tol, grad_tol = TOLERANCE[dtype]
    assert rel(out, ref_o) < o_tol
    assert lse_diff(lse, ref_lse) < lse_tol
    (out * do).sum().backward()
    refs = torch.autograd.grad((ref_o * do.double()).sum(), (q, k, v))
    for name, x, ref in zip("qkv", (q, k, v), refs):
        assert rel(x.grad, ref) < grad_tol, f"d{name}"


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_varlen_paged_keys(device, dtype):
    setup_device(device)
    g = torch.Generator().manual_seed(seed("varlen-paged"))
    q_lengths, k_lengths, page = (2, 1, 5), (19, 1, 40), 16
    k = randn(g, sum(k_lengths), 2, 64, dtype=dtype, device=device)
    v = randn(g, sum(k_lengths), 2, 64, dtype=dtype, device=device)
    q = randn(g, sum(q_lengths), 4, 64, dtype=dtype, device=device)
    k_cache, v_cache, table = to_pages(g, [k, v], k_lengths, page, device)
    out = flash_attn_varlen_func(q, k_cache, v_cache, offsets(q_lengths, device),
                                 offsets(k_lengths, device), 5, 40, causal=True,
                                 block_table=table)
    ref_o, _ = reference_documents(q, k, v, q_lengths, k_lengths, causal=True)
    assert rel(out, ref_o) < TOLERANCE[dtype][0]


def to_pages(g, packed, lengths, page, device, spare=2):
    """Paged caches (NaN where no key is) holding each packed document's rows in shuffled pages,
    and the block table."""
    pages_per = max(-(-n // page) for n in lengths)
    count = len(lengths) * pages_per + spare
    order = torch.randperm(count, generator=g)
    table = torch.zeros(len(lengths), pages_per, dtype=torch.int32)
    caches = [torch.full((count, page) + x.shape[1:], math.nan, dtype=x.dtype, device=device)
              for x in packed]
    start = 0
    for b, n in enumerate(lengths):
        for p in range(pages_per):
            table[b, p] = order[b * pages_per + p]
            rows = range(p * page, min(n, (p + 1) * page))
            for cache, x in zip(caches, packed):
                cache[table[b, p], :len(rows)] = x[start + rows.start:start + rows.stop]
        start += n
    return caches[0], caches[1], table.to(device)


# --- flash_attn_with_kvcache -------------------------------------------------------------------

KVCACHE_CASES = [
    # (paged page size or 0, seqlen_new, seqlen_q, causal, window, softcap, alibi)
    (0, 1, 1, True, (-1, -1), 0.0, False),  # contiguous, decode
    (16, 3, 3, True, (-1, -1), 0.0, False),  # paged, decode, chunked prefill
    (0, 0, 1, False, (-1, -1), 0.0, False),  # no append
    (0, 2, 2, True, (7, 0), 10.0, True),  # contiguous, the gathered path
    (16, 1, 1, True, (-1, -1), 15.0, False),  # paged, the gathered path
    (8, 1, 1, False, (-1, -1), 0.0, False),  # a page size decode does not take
]


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("case", KVCACHE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_kvcache_appends_and_attends(device, dtype, case):
    setup_device(device)
    page, seqlen_new, sq, causal, window, softcap, alibi = case
    g = torch.Generator().manual_seed(seed("kvcache", case))
    lengths = [5, 0, 17, 32]  # keys already cached per sequence
    batch, h, hkv, d, capacity = len(lengths), 8, 2, 64, 48
    old_k = [randn(g, n, hkv, d, dtype=dtype, device=device) for n in lengths]
    old_v = [randn(g, n, hkv, d, dtype=dtype, device=device) for n in lengths]
    new_k = randn(g, batch, seqlen_new, hkv, d, dtype=dtype, device=device)
    new_v = randn(g, batch, seqlen_new, hkv, d, dtype=dtype, device=device)
    q = randn(g, batch, sq, h, d, dtype=dtype, device=device)
    slopes = (torch.rand(h, generator=g) * 0.5 + 0.05).to(device) if alibi else None
    if page:
        full = [capacity] * batch
        padded = [torch.cat((x, torch.full((capacity - x.shape[0], hkv, d), math.nan,
                                           dtype=dtype, device=device))) for x in old_k]
        padded_v = [torch.cat((x, torch.full((capacity - x.shape[0], hkv, d), math.nan,
                                             dtype=dtype, device=device))) for x in old_v]
        k_cache, v_cache, table = to_pages(g, [torch.cat(padded), torch.cat(padded_v)], full,
                                           page, device)
    else:
        k_cache = torch.full((batch, capacity, hkv, d), math.nan, dtype=dtype, device=device)
        v_cache = k_cache.clone()
        for b, n in enumerate(lengths):
            k_cache[b, :n], v_cache[b, :n] = old_k[b], old_v[b]
        table = None
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, k=new_k if seqlen_new else None, v=new_v if seqlen_new else None,
        cache_seqlens=seqlens, block_table=table, causal=causal, window_size=window,
        softcap=softcap, alibi_slopes=slopes, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, h, sq)
    o_tol, lse_tol, _ = TOLERANCE[dtype]
    for b, n in enumerate(lengths):
        keys = torch.cat((old_k[b], new_k[b]))
        values = torch.cat((old_v[b], new_v[b]))
        # The new rows are in the cache, in place, right after the old ones.
        if page:
            rows = torch.cat([k_cache[table[b, p]] for p in range(table.shape[1])])
        else:
            rows = k_cache[b]
        assert torch.equal(rows[:n + seqlen_new], keys), f"sequence {b}: cache after append"
        if n + seqlen_new == 0:
            continue
        ref_o, ref_lse = reference(q[b:b + 1], keys[None], values[None], causal=causal,
                                   window=window, softcap=softcap, alibi=slopes)
        assert rel(out[b:b + 1], ref_o) < o_tol, f"sequence {b}"
        assert lse_diff(lse[b:b + 1], ref_lse) < lse_tol, f"sequence {b}"


def test_kvcache_int_seqlens_and_default():
    require_cpu_backward()
    g = torch.Generator().manual_seed(seed("kvcache-int"))
    q = randn(g, 2, 1, 4, 64, dtype=torch.float32, device="cpu")
    k_cache = randn(g, 2, 20, 4, 64, dtype=torch.float32, device="cpu")
    v_cache = randn(g, 2, 20, 4, 64, dtype=torch.float32, device="cpu")
    new = randn(g, 2, 1, 4, 64, dtype=torch.float32, device="cpu")
    out = flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=7)
    assert torch.equal(k_cache[:, 7:8], new) and torch.equal(v_cache[:, 7:8], new)
    ref, _ = reference(q, k_cache[:, :8], v_cache[:, :8])
    assert rel(out, ref) < 2e-5
    # cache_seqlens=None: the whole cache (flash_attn's default), new keys in its last rows.
    out = flash_attn_with_kvcache(q, k_cache, v_cache, new * 2, new * 2)
    assert torch.equal(k_cache[:, 19:], new * 2)
    ref, _ = reference(q, k_cache, v_cache)
    assert rel(out, ref) < 2e-5


# --- what flashjit does not do -----------------------------------------------------------------

def test_unsupported_arguments_raise_typed_errors():
    require_cpu_backward()
    q = torch.randn(1, 5, 2, 64)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    index = torch.zeros(1, dtype=torch.int32)
    slopes = torch.full((2,), 0.5)
    cases = [
        (lambda: flash_attn_func(q, q, q, dropout_p=0.1), "dropout_p"),
        (lambda: flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 5, 5, dropout_p=0.5),
         "dropout_p"),
        (lambda: flash_attn_func(q, q, q, alibi_slopes=slopes), "alibi_slopes"),
        (lambda: flash_attn_func(q, q, q, causal=True, alibi_slopes=torch.ones(1, 2)),
         "alibi_slopes"),
        (lambda: flash_attn_with_kvcache(q, q, q, rotary_cos=torch.ones(5, 32),
                                         rotary_sin=torch.ones(5, 32)), "rotary_cos"),
        (lambda: flash_attn_with_kvcache(q, q, q, cache_batch_idx=index),
         "cache_batch_idx"),
        (lambda: flash_attn_with_kvcache(q, q, q, cache_leftpad=index),
         "cache_leftpad"),
    ]
    for call, name in cases:
        with pytest.raises(flashjit.UnsupportedError, match=name):
            call()
    invalid = [
        (lambda: flash_attn_func(q, q, q, window_size=5), "window_size"),
        (lambda: flash_attn_func(q, q, q, window_size=(-2, 0)), "window"),
        (lambda: flash_attn_with_kvcache(q, q, q, k=q), "k and v"),
        (lambda: flash_attn_with_kvcache(q, q, q, cache_seqlens=torch.zeros(3, dtype=torch.int32)),
         "cache_seqlens"),
        (lambda: flash_attn_with_kvcache(q, q, q,
                                         block_table=torch.zeros(2, 1, dtype=torch.int32)),
         "block_table"),
    ]
    for call, name in invalid:
        with pytest.raises(flashjit.InvalidArgumentError, match=name):
            call()
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        flash_attn_func(q.numpy(), q, q)


def test_func_and_varlen_under_torch_compile():
    """fullgraph=True traces both (flashjit's custom operators; the lse conversion is torch
    ops): the same output, lse and gradient as eager (aot_eager: the same kernels)."""
    require_cpu_backward()
    import torch._dynamo

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(seed("compile"))
    q = randn(g, 2, 17, 4, 64, dtype=torch.float32, device="cpu", grad=True)
    k = randn(g, 2, 17, 2, 64, dtype=torch.float32, device="cpu", grad=True)

    def func(q, k):
        return flash_attn_func(q, k, k, causal=True, window_size=(5, 0),
                               return_attn_probs=True)[:2]

    compiled = torch.compile(func, backend="aot_eager", fullgraph=True)
    (o, lse), (o_eager, lse_eager) = compiled(q, k), func(q, k)
    assert torch.equal(o, o_eager) and torch.equal(lse, lse_eager)
    grad = torch.autograd.grad(o.sum(), q)[0]
    assert torch.equal(grad, torch.autograd.grad(o_eager.sum(), q)[0])
    cu = offsets((5, 1, 28), "cpu")
    packed_q, packed_k = q.detach().reshape(34, 4, 64), k.detach().reshape(34, 2, 64)

    def varlen(q, k):
        return flash_attn_varlen_func(q, k, k, cu, cu, 28, 28, causal=True,
                                      return_attn_probs=True)[:2]

    compiled = torch.compile(varlen, backend="aot_eager", fullgraph=True)
    (o, lse), (o_eager, lse_eager) = compiled(packed_q, packed_k), varlen(packed_q, packed_k)
    assert torch.equal(o, o_eager) and torch.equal(lse, lse_eager)
    torch._dynamo.reset()
