"""Attention variants with torch autograd (issue 17): flashjit.attention's gradients dq, dk, dv
of window, softcap, ALiBi, prefix-LM, mask_mod and score_mod (with score_mod_grad) calls against
torch autograd through an eager fp64 reference of the same variant, on the CPU backend (fp32, and
bf16 for one case) and on CUDA (bf16; skips without a GPU); GQA, causal with seqlen_q != seqlen_k,
rows that see no key (dq = 0, no NaN); the custom operator's backward under torch.compile; the
typed errors (a score_mod without score_mod_grad, slopes that require grad). Packed
variable-length documents (cu_seqlens) with a window + softcap, per document, likewise."""
import math

import pytest

import flashjit
from conftest import have_module, require_cpu_backend, require_gpu, seed

if not have_module("torch"):
    pytest.skip("torch is not installed", allow_module_level=True)

import torch  # noqa: E402


def slopes(heads, device="cpu"):
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)],
                        dtype=torch.float32, device=device)


def reference(q, k, v, causal=False, window=None, softcap=None, alibi_slopes=None, prefix=0,
              score_mod=None, mask_mod=None):
    """Eager fp64 attention of the variant (generator/problem.hpp's definition) on bshd tensors,
    differentiable by torch autograd; a row that sees no key has o = 0 (and no gradient)."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))  # (b, h, s, d)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    seqlen_q, seqlen_k = q.shape[2], k.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    i = torch.arange(seqlen_q).view(1, 1, -1, 1)
    j = torch.arange(seqlen_k).view(1, 1, 1, -1)
    b = torch.arange(q.shape[0]).view(-1, 1, 1, 1)
    h = torch.arange(q.shape[1]).view(1, -1, 1, 1)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + alibi_slopes.double().view(1, -1, 1, 1) * (j - i)
    if score_mod is not None:
        s = score_mod(s, b, h, i, j)
    diagonal = seqlen_k - seqlen_q
    band = torch.ones(1, 1, seqlen_q, seqlen_k, dtype=torch.bool)
    left, right = window if window is not None else (-1, -1)
    if causal:
        band = band & (j <= i + diagonal)
    if left >= 0:
        band = band & (j >= i + diagonal - left)
    if right >= 0:
        band = band & (j <= i + diagonal + right)
    visible = band | (j < prefix)
    if mask_mod is not None:
        visible = visible & mask_mod(b, h, i, j)
    visible = visible.expand(s.shape)
    seen = visible.any(dim=-1, keepdim=True)
    s = torch.where(seen, s.masked_fill(~visible, -math.inf), torch.zeros_like(s))
    p = torch.softmax(s, dim=-1) * seen
    return (p @ v).transpose(1, 2)


# (id, flashjit's variant kwargs, the reference's, causal, (seqlen_q, seqlen_k))
CASES = [
    ("window-softcap-alibi-gqa-causal", dict(window=(15, 0), softcap=4.0, alibi=True),
     dict(window=(15, 0), softcap=4.0, alibi=True), True, (67, 90)),
    # diagonal -50: rows below 45 see no key
    ("window-both-sides-empty-rows", dict(window=(3, 5)), dict(window=(3, 5)), False, (90, 40)),
    ("prefix-window-mask-mod-causal",
     dict(prefix=9, window=(5, 0), mask_mod="(q_idx + kv_idx) % 5 != 0"),
     dict(prefix=9, window=(5, 0), mask_mod=lambda b, h, i, j: (i + j) % 5 != 0), True, (70, 70)),
    ("score-mod-softcap",
     dict(softcap=2.0, score_mod="score * score * 0.25f + score + 0.1f * head",
          score_mod_grad="score * 0.5f + 1.0f"),
     dict(softcap=2.0, score_mod=lambda s, b, h, i, j: s * s * 0.25 + s + 0.1 * h), False,
     (33, 65)),
]


def relative_error(mine, theirs):
    mine, theirs = mine.double(), theirs.double()
    return ((mine - theirs).norm() / theirs.norm().clamp_min(1e-30)).item()


def check_gradients(device, dtype, case, limit, heads_q=4, heads_kv=2, head_dim=64):
    name, mine, theirs, causal, (seqlen_q, seqlen_k) = case
    generator = torch.Generator().manual_seed(seed("variant-backward", name, str(dtype)))

    def tensor(seqlen, heads):
        x = torch.randn(2, seqlen, heads, head_dim, generator=generator)
        return x.to(dtype=dtype, device=device).requires_grad_()

    q, k, v = tensor(seqlen_q, heads_q), tensor(seqlen_k, heads_kv), tensor(seqlen_k, heads_kv)
    do = torch.randn(2, seqlen_q, heads_q, head_dim, generator=generator).to(dtype=dtype,
                                                                              device=device)
    mine, theirs = dict(mine), dict(theirs)
    if mine.pop("alibi", False):
        mine["alibi_slopes"] = slopes(heads_q, device)
        theirs.pop("alibi")
        theirs["alibi_slopes"] = mine["alibi_slopes"].cpu()
    out = flashjit.attention(q, k, v, causal=causal, **mine)
    assert out.requires_grad, name
    grads = torch.autograd.grad(out, (q, k, v), do)
    cpu = [x.detach().cpu().requires_grad_() for x in (q, k, v)]
    ref = reference(*cpu, causal=causal, **theirs)
    ref_grads = torch.autograd.grad(ref, cpu, do.cpu().double())
    for what, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert torch.isfinite(g).all(), f"{name}: {what} has NaN/inf"
        error = relative_error(g.cpu(), r)
        assert error < limit, f"{name} {dtype}: {what} relative error {error:.2e} >= {limit}"
    # The variant matters here: plain attention's gradients are far off.
    plain = torch.autograd.grad(reference(*cpu, causal=causal), cpu, do.cpu().double())
    assert relative_error(plain[0], ref_grads[0]) > 10 * limit, f"{name}: the variant is a no-op"
    return grads


def check_varlen_gradients(device, dtype, limit, head_dim=64):
    """Packed documents of 1, 17, 0, 40 and 33 queries against 3, 17, 4, 25 and 0 keys (5 spare
    rows after them), GQA 4:2, causal with a window + softcap: flashjit.attention's autograd
    gradients against the reference's of each document alone; the spare rows get none."""
    q_lengths, k_lengths, spare = [1, 17, 0, 40, 33], [3, 17, 4, 25, 0], 5
    cu_q = torch.tensor([0] + q_lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_k = torch.tensor([0] + k_lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    rows_q, rows_k = int(cu_q[-1]), int(cu_k[-1])
    generator = torch.Generator().manual_seed(seed("varlen-backward-torch", str(dtype)))

    def tensor(rows, heads):
        x = torch.randn(rows, heads, head_dim, generator=generator)
        return x.to(dtype=dtype, device=device).requires_grad_()

    q, k, v = tensor(rows_q + spare, 4), tensor(rows_k + spare, 2), tensor(rows_k + spare, 2)
    do = torch.randn(rows_q + spare, 4, head_dim, generator=generator).to(dtype=dtype,
                                                                         device=device)
    variant = dict(window=(6, 0), softcap=3.0)
    out = flashjit.attention(q, k, v, causal=True, cu_seqlens_q=cu_q.to(device),
                             cu_seqlens_k=cu_k.to(device), **variant)
    assert out.requires_grad
    grads = torch.autograd.grad(out, (q, k, v), do)
    cpu = [x.detach().cpu().double() for x in (q, k, v)]
    expected = [torch.zeros_like(x) for x in cpu]
    for b in range(len(q_lengths)):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        doc = [x[None, r0:r1].clone().requires_grad_()
               for x, (r0, r1) in zip(cpu, ((q0, q1), (k0, k1), (k0, k1)))]
        ref = reference(*doc, causal=True, **variant)
        doc_grads = torch.autograd.grad(ref, doc, do.cpu().double()[None, q0:q1])
        for full, g, (r0, r1) in zip(expected, doc_grads, ((q0, q1), (k0, k1), (k0, k1))):
            full[r0:r1] = g[0]
    for what, g, r, rows in zip(("dq", "dk", "dv"), grads, expected, (rows_q, rows_k, rows_k)):
        g = g.cpu()
        assert torch.isfinite(g).all(), f"varlen {dtype}: {what} has NaN/inf"
        error = relative_error(g[:rows], r[:rows])
        assert error < limit, f"varlen {dtype}: {what} relative error {error:.2e} >= {limit}"
        assert torch.count_nonzero(g[rows:]) == 0, f"varlen: {what} of the spare rows"


# ---- CPU backend -------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cpu_gradients_match_torch_autograd_of_the_reference(case):
    require_cpu_backend()
    check_gradients("cpu", torch.float32, case, 2e-4)


def test_cpu_bf16_gradients():
    require_cpu_backend()
    check_gradients("cpu", torch.bfloat16, CASES[0], 2e-2)


def test_cpu_varlen_gradients_per_document():
    require_cpu_backend()
    check_varlen_gradients("cpu", torch.float32, 2e-4)


def test_rows_that_see_no_key_get_zero_dq():
    require_cpu_backend()
    q = torch.randn(1, 30, 2, 64, requires_grad=True)
    k, v = torch.randn(1, 10, 2, 64), torch.randn(1, 10, 2, 64)
    # diagonal -20: rows below 20 see nothing, row 20 key 0 alone (P = 1: no gradient either),
    # rows above 20 two keys.
    out = flashjit.attention(q, k, v, window=(1, 0))
    (dq,) = torch.autograd.grad(out.sum(), (q,))
    assert torch.isfinite(dq).all()
    assert torch.count_nonzero(dq[:, :21]) == 0
    assert bool((dq[:, 21:].abs().sum(dim=-1) > 0).all())


def test_score_mod_without_its_gradient_is_a_typed_error():
    require_cpu_backend()
    q = torch.randn(1, 9, 2, 64, requires_grad=True)
    k, v = torch.randn(1, 9, 2, 64), torch.randn(1, 9, 2, 64)
    out = flashjit.attention(q, k, v, score_mod="score * 2.0f")  # the forward needs none
    with pytest.raises(flashjit.InvalidArgumentError, match="needs score_mod_grad"):
        out.sum().backward()
    with torch.no_grad():  # and without autograd nothing is asked
        flashjit.attention(q, k, v, score_mod="score * 2.0f")
    with pytest.raises(TypeError, match="score_mod_grad"):
        flashjit.attention(q, k, v, score_mod="score", score_mod_grad=1.0)


def test_slopes_that_require_grad_are_refused():
    require_cpu_backend()
    q = torch.randn(1, 9, 2, 64, requires_grad=True)
    k, v = torch.randn(1, 9, 2, 64), torch.randn(1, 9, 2, 64)
    with pytest.raises(flashjit.UnsupportedError, match="alibi_slopes requires grad"):
        flashjit.attention(q, k, v, alibi_slopes=torch.ones(2, requires_grad=True))
    assert flashjit.attention(q, k, v, alibi_slopes=torch.ones(2)).requires_grad


def test_attention_backward_takes_the_variant():
    """flashjit.attention_backward with the forward's variant, on torch tensors and on numpy
    arrays: the variant's gradients."""
    require_cpu_backend()
    name, mine, theirs, causal, (seqlen_q, seqlen_k) = CASES[0]
    generator = torch.Generator().manual_seed(seed("attention-backward-variant"))
    q = torch.randn(2, seqlen_q, 4, 64, generator=generator)
    k, v = (torch.randn(2, seqlen_k, 2, 64, generator=generator) for _ in range(2))
    do = torch.randn(2, seqlen_q, 4, 64, generator=generator)
    variant = dict(window=mine["window"], softcap=mine["softcap"], alibi_slopes=slopes(4))
    o, lse = flashjit.attention(q, k, v, causal=causal, return_lse=True, **variant)
    cpu = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = reference(*cpu, causal=causal, window=mine["window"], softcap=mine["softcap"],
                    alibi_slopes=variant["alibi_slopes"])
    expected = torch.autograd.grad(ref, cpu, do.double())
    as_torch = flashjit.attention_backward(q, k, v, o, lse, do, causal=causal, **variant)
    as_numpy = flashjit.attention_backward(
        q.numpy(), k.numpy(), v.numpy(), o.numpy(), lse.numpy(), do.numpy(), causal=causal,
        window=mine["window"], softcap=mine["softcap"], alibi_slopes=slopes(4).numpy())
    for what, a, b, r in zip(("dq", "dk", "dv"), as_torch, as_numpy, expected):
        assert relative_error(a, r) < 2e-4, what
        assert relative_error(torch.from_numpy(b), r) < 2e-4, what
    plain = flashjit.attention_backward(q, k, v, o, lse, do, causal=causal)
    assert relative_error(plain[0], expected[0]) > 1e-2  # the variant's backward, not plain's


def test_torch_compile_backward_of_the_variant_operator():
    """torch.compile(fullgraph=True) traces the custom operators, forward and backward, with the
    variant's fields: the same gradients as the eager path."""
    require_cpu_backend()
    import torch._dynamo

    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(seed("compile-variant-backward"))
    q, k, v = (torch.randn(1, 2, 40, 64, generator=generator).requires_grad_() for _ in range(3))
    heads_slopes = slopes(2)

    def f(q, k, v, s):
        return flashjit.sdpa(q, k, v, is_causal=True, window=(8, 0), softcap=20.0,
                             alibi_slopes=s, score_mod="score * 0.5f",
                             score_mod_grad="0.5f")

    eager = torch.autograd.grad(f(q, k, v, heads_slopes).square().sum(), (q, k, v))
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    traced = torch.autograd.grad(compiled(q, k, v, heads_slopes).square().sum(), (q, k, v))
    for a, b in zip(eager, traced):
        assert torch.equal(a, b)


# ---- CUDA ------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cuda_gradients_match_torch_autograd_of_the_reference(case):
    require_gpu()
    check_gradients("cuda", torch.bfloat16, case, 2e-2, head_dim=128)


def test_cuda_varlen_gradients_per_document():
    require_gpu()
    check_varlen_gradients("cuda", torch.bfloat16, 2e-2, head_dim=128)
