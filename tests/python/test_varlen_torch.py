"""Packed variable-length documents (flashjit.attention with cu_seqlens_q / _k) under
torch.compile(fullgraph=True) with autograd (issue 17): the custom operators
flashjit::attention_varlen and flashjit::attention_varlen_backward (torch.library.opcheck), the
compiled forward and loss.backward() of documents of 1, 17, 100 and 3 rows (causal and not, GQA,
seqlen_q != seqlen_k per document, a lone 1-row document, a window + softcap + ALiBi) against an
fp64 reference of each document alone (torch SDPA's math backend, conftest.torch_reference) and
against the eager path (bitwise with aot_eager: the same kernels), a module with parameters under
inductor, no graph break (fullgraph) and the operators in the traced graphs, new packings
reusing the compiled graph (one recompile: max_seqlen_q / _k stay dynamic) while eager calls skip
the operators, torch.autocast alike on every path, the typed error of max_seqlen_q / _k left None
under compile; float32 and bfloat16 on the CPU backend, bfloat16 on CUDA (skips without a GPU).
Skips without torch or without the CPU backward."""
import pytest

import flashjit
from conftest import (gradient_tolerance, have_module, require_cpu_backward, require_gpu, seed,
                      torch_reference, torch_relative_error)

if not have_module("torch"):
    pytest.skip("torch is not installed", allow_module_level=True)

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

# Relative L2 error of a float32 forward against fp64 (the CPU kernels accumulate in fp32), as
# test_torch_cpu.py's.
FORWARD_F32 = 1e-5


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def offsets(lengths, device="cpu"):
    return torch.tensor([0] + list(lengths), dtype=torch.int32).cumsum(0, dtype=torch.int32).to(
        device)


def packed_inputs(q_lengths, k_lengths, heads_q, heads_kv, dtype, device="cpu", head_dim=64,
                  spare=0, tag=""):
    """q (total_q, heads_q, d), k, v (total_k, heads_kv, d) (leaves requiring grad, `spare` rows
    past the last document) and do, from a per-case seed."""
    generator = torch.Generator().manual_seed(seed("varlen-torch", q_lengths, k_lengths, heads_q,
                                                   heads_kv, str(dtype), device, tag))
    total_q, total_k = sum(q_lengths) + spare, sum(k_lengths) + spare

    def randn(*size):
        return torch.randn(size, generator=generator).to(dtype=dtype, device=device)

    q = randn(total_q, heads_q, head_dim).requires_grad_()
    k = randn(total_k, heads_kv, head_dim).requires_grad_()
    v = randn(total_k, heads_kv, head_dim).requires_grad_()
    return q, k, v, randn(total_q, heads_q, head_dim)


def reference_per_document(q, k, v, do, q_lengths, k_lengths, causal):
    """fp64 (o, dq, dk, dv) over the document rows of L = sum(do * o), each document's of its own
    attention (conftest.torch_reference: SDPA's math backend, GQA, bottom-right causal); rows
    past the last document: zero gradients (o: zero, not compared)."""
    o, dq, dk, dv = (torch.zeros(x.shape, dtype=torch.float64) for x in (q, q, k, v))
    q0 = k0 = 0
    for len_q, len_k in zip(q_lengths, k_lengths):
        q1, k1 = q0 + len_q, k0 + len_k
        if len_q and len_k:
            doc = torch_reference(*(x.detach().cpu()[None, r0:r1] for x, (r0, r1) in zip(
                (q, k, v, do), ((q0, q1), (k0, k1), (k0, k1), (q0, q1)))), causal=causal)
            for full, part, (r0, r1) in zip((o, dq, dk, dv), doc,
                                            ((q0, q1), (q0, q1), (k0, k1), (k0, k1))):
                full[r0:r1] = part[0]
        q0, k0 = q1, k1
    return o, dq, dk, dv


def check_against_reference(o, grads, q, k, v, do, q_lengths, k_lengths, causal):
    """o over the document rows and every gradient (spare rows included: zero) against
    reference_per_document, within conftest's gradient_tolerance of the dtype (the float32
    forward within FORWARD_F32)."""
    ref = reference_per_document(q, k, v, do, q_lengths, k_lengths, causal)
    tolerance = gradient_tolerance(str(q.dtype).replace("torch.", ""))
    rows = sum(q_lengths)
    o_bound = max(FORWARD_F32, tolerance / 4) if q.dtype == torch.float32 else tolerance
    assert o.shape == q.shape and o.dtype == q.dtype
    assert torch_relative_error(o[:rows].cpu(), ref[0][:rows]) < o_bound, "o"
    for name, grad, expected, like in zip(("dq", "dk", "dv"), grads, ref[1:], (q, k, v)):
        assert grad.shape == like.shape and grad.dtype == like.dtype, name
        assert torch_relative_error(grad.cpu(), expected) < tolerance, name


def documents(q_lengths, k_lengths, device="cpu"):
    return dict(cu_seqlens_q=offsets(q_lengths, device), cu_seqlens_k=offsets(k_lengths, device),
                max_seqlen_q=max(q_lengths), max_seqlen_k=max(k_lengths))


def attend(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, **variant):
    return flashjit.attention(q, k, v, causal=causal, cu_seqlens_q=cu_seqlens_q,
                              cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                              max_seqlen_k=max_seqlen_k, **variant)


def compiled_and_eager(q, k, v, do, docs, causal, backend="aot_eager", **variant):
    """[(o, dq, dk, dv)] of the compiled (fullgraph: a graph break fails) and the eager call."""
    run = torch.compile(attend, fullgraph=True, backend=backend)
    results = []
    for f in (run, attend):
        o = f(q, k, v, **docs, causal=causal, **variant)
        assert o.requires_grad
        (o * do).sum().backward()
        results.append((o.detach(),) + tuple(x.grad for x in (q, k, v)))
        for x in (q, k, v):
            x.grad = None
    return results


# (id, q lengths, k lengths, heads_q, heads_kv, spare rows)
CASES = [
    ("docs-1-17-100-3-gqa", [1, 17, 100, 3], [1, 17, 100, 3], 4, 2, 5),
    ("cross-q!=k-mqa", [1, 17, 100, 3], [9, 17, 40, 30], 2, 1, 0),
    ("one-document-of-1-row", [1], [1], 2, 2, 0),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_compiled_documents_match_the_reference_and_the_eager_path(case, causal):
    require_cpu_backward()
    _, q_lengths, k_lengths, heads_q, heads_kv, spare = case
    q, k, v, do = packed_inputs(q_lengths, k_lengths, heads_q, heads_kv, torch.float32,
                                spare=spare)
    docs = documents(q_lengths, k_lengths)
    compiled, eager = compiled_and_eager(q, k, v, do, docs, causal)
    rows = sum(q_lengths)
    assert torch.equal(compiled[0][:rows], eager[0][:rows])  # the same kernels
    for a, b in zip(compiled[1:], eager[1:]):
        assert torch.equal(a, b)
    check_against_reference(compiled[0], compiled[1:], q, k, v, do, q_lengths, k_lengths, causal)
    for grad, end in zip(compiled[1:], (rows, sum(k_lengths), sum(k_lengths))):
        assert torch.count_nonzero(grad[end:]) == 0  # rows past the last document: none
    # The documents matter: one document of all the rows is a different answer.
    if len(q_lengths) > 1:
        merged = reference_per_document(q, k, v, do, [sum(q_lengths)], [sum(k_lengths)], causal)
        assert torch_relative_error(compiled[1].cpu(), merged[1]) > 10 * gradient_tolerance(
            "float32")


def test_compiled_bf16_documents():
    require_cpu_backward()
    q_lengths = [1, 17, 100, 3]
    q, k, v, do = packed_inputs(q_lengths, q_lengths, 4, 2, torch.bfloat16, tag="bf16")
    compiled, eager = compiled_and_eager(q, k, v, do, documents(q_lengths, q_lengths), True)
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)
    check_against_reference(compiled[0], compiled[1:], q, k, v, do, q_lengths, q_lengths, True)


def test_compiled_variant_of_documents_matches_the_eager_path():
    """A window + softcap + ALiBi with documents: the variant's fields travel through the
    operators (the eager path's gradients of the same variant, bitwise; plain attention's
    differ)."""
    require_cpu_backward()
    q_lengths = [1, 17, 100, 3]
    q, k, v, do = packed_inputs(q_lengths, q_lengths, 4, 2, torch.float32, tag="variant")
    docs = documents(q_lengths, q_lengths)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    variant = dict(window=(6, 0), softcap=3.0, alibi_slopes=slopes)
    compiled, eager = compiled_and_eager(q, k, v, do, docs, True, **variant)
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)
    plain = reference_per_document(q, k, v, do, q_lengths, q_lengths, True)
    assert torch_relative_error(compiled[1], plain[1]) > 1e-2
    # Refused while dynamo traces (as for attention without documents): dynamo's Unsupported
    # carries flashjit's message.
    with pytest.raises((flashjit.UnsupportedError, torch._dynamo.exc.Unsupported),
                       match="alibi_slopes requires grad"):
        torch.compile(attend, fullgraph=True, backend="aot_eager")(
            q, k, v, **docs, causal=True, alibi_slopes=slopes.clone().requires_grad_())


def test_compiled_module_with_parameters_inductor():
    """A packed-documents attention block (qkv projection, flashjit.attention with cu_seqlens,
    output projection) under torch.compile(fullgraph=True, backend="inductor"): loss and
    parameter gradients as the eager module's (to float32 rounding: inductor fuses the
    projections), all parameters reached."""
    require_cpu_backward()
    width, heads, heads_kv, head_dim = 64, 4, 2, 16
    lengths = [1, 17, 100, 3]
    torch.manual_seed(seed("varlen-module-init"))
    qkv = torch.nn.Linear(width, (heads + 2 * heads_kv) * head_dim)
    proj = torch.nn.Linear(heads * head_dim, width)
    docs = documents(lengths, lengths)

    def block(x):
        q, k, v = qkv(x).split([heads * head_dim, heads_kv * head_dim, heads_kv * head_dim], 1)
        y = attend(q.reshape(-1, heads, head_dim), k.reshape(-1, heads_kv, head_dim),
                   v.reshape(-1, heads_kv, head_dim), **docs, causal=True)
        return proj(y.reshape(-1, heads * head_dim))

    x = torch.randn(sum(lengths), width,
                    generator=torch.Generator().manual_seed(seed("varlen-module")))
    results = []
    for f in (torch.compile(block, fullgraph=True, backend="inductor"), block):
        loss = f(x).square().mean()
        params = list(qkv.parameters()) + list(proj.parameters())
        results.append([loss.detach()] + list(torch.autograd.grad(loss, params)))
    for a, b in zip(*results):
        assert torch_relative_error(a, b.double()) < 1e-5
    assert all(g.abs().sum() > 0 for g in results[0][1:])


def test_compiled_graphs_hold_the_varlen_operators():
    """The forward graph holds flashjit::attention_varlen, the backward graph
    flashjit::attention_varlen_backward (not a trace of the extension's Python); without a
    gradient the compiled call takes the operator too."""
    require_cpu_backward()
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(str(gm.graph))
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=capture, bw_compiler=capture)
    lengths = [1, 17, 100, 3]
    q, k, v, do = packed_inputs(lengths, lengths, 2, 2, torch.float32, tag="graphs")
    docs = documents(lengths, lengths)
    run = torch.compile(attend, fullgraph=True, backend=backend)
    torch.autograd.grad(run(q, k, v, **docs, causal=True), (q, k, v), do)
    assert len(graphs) == 2, graphs
    assert "flashjit.attention_varlen.default" in graphs[0]
    assert "flashjit.attention_varlen_backward.default" in graphs[1]
    with torch.no_grad():
        traced = torch.compile(attend, fullgraph=True, backend="aot_eager")(
            q, k, v, **docs, causal=False, return_lse=True)
        eager = attend(q, k, v, **docs, causal=False, return_lse=True)
        assert eager[1].shape == (2 * q.shape[0],)  # packed: (heads * total_q,)
        for a, b in zip(traced, eager):
            assert torch.equal(a, b)


def test_new_documents_reuse_the_compiled_graph_and_eager_calls_skip_the_operators():
    """Each batch packs other documents (other totals, offsets and longest lengths): after
    dynamo's one recompile for dynamic sizes, the compiled call is reused (max_seqlen_q / _k stay
    dynamic ints, not specialized), every result equal to the eager path's. Eager calls take the
    direct paths (the autograd node _VarlenAttention; without a gradient no node), not the
    operators."""
    require_cpu_backward()
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    run = torch.compile(attend, fullgraph=True, backend=count)
    for lengths in ([1, 17, 100, 3], [5, 30, 2, 7, 40], [64, 1], [3, 3, 3, 9, 3, 1]):
        q, k, v, do = packed_inputs(lengths, lengths, 4, 2, torch.float32, tag="dynamic")
        docs = documents(lengths, lengths)
        mine = run(q, k, v, **docs, causal=True)
        eager = attend(q, k, v, **docs, causal=True)
        assert type(eager.grad_fn).__name__ == "_VarlenAttentionBackward"
        assert torch.equal(mine, eager)
        for a, b in zip(torch.autograd.grad(mine, (q, k, v), do),
                        torch.autograd.grad(eager, (q, k, v), do)):
            assert torch.equal(a, b)
    assert len(graphs) == 2, f"{len(graphs)} compiles for 4 packings"
    with torch.no_grad():
        assert attend(q, k, v, **docs, causal=True).grad_fn is None


def test_autocast_casts_float32_documents_on_every_path():
    """Under torch.autocast float32 inputs are cast (as SDPA's): eager with and without a
    gradient and compiled all give the autocast dtype and the same values."""
    require_cpu_backward()
    lengths = [1, 17, 100, 3]
    q, k, v, do = packed_inputs(lengths, lengths, 4, 2, torch.float32, tag="autocast")
    docs = documents(lengths, lengths)
    run = torch.compile(attend, fullgraph=True, backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with_grad = attend(q, k, v, **docs, causal=True)
        compiled = run(q, k, v, **docs, causal=True)
        with torch.no_grad():
            without = attend(q, k, v, **docs, causal=True)
            compiled_without = run(q, k, v, **docs, causal=True)
    for o in (with_grad, compiled, without, compiled_without):
        assert o.dtype == torch.bfloat16
        assert torch.equal(o, with_grad)
    (dq,) = torch.autograd.grad(compiled, (q,), do.bfloat16())
    assert dq.dtype == torch.float32  # the leaf's dtype
    ref = reference_per_document(q, k, v, do, lengths, lengths, True)
    assert torch_relative_error(dq, ref[1]) < 2 * gradient_tolerance("bfloat16")


@pytest.mark.parametrize("missing", ["max_seqlen_q", "max_seqlen_k"])
def test_max_seqlen_none_under_compile_is_a_typed_error(missing):
    """max_seqlen_q / _k None under torch.compile: InvalidArgumentError naming the argument
    (computing it from the offsets would be a data-dependent host read); eager calls still
    compute it."""
    require_cpu_backward()
    lengths = [1, 17, 3]
    q, k, v, do = packed_inputs(lengths, lengths, 2, 2, torch.float32, tag="none")
    docs = dict(documents(lengths, lengths), **{missing: None})
    run = torch.compile(attend, fullgraph=True, backend="aot_eager")
    with pytest.raises(flashjit.InvalidArgumentError, match=f"{missing} is None under "
                                                            f"torch.compile"):
        run(q, k, v, **docs, causal=True)
    eager = attend(q, k, v, **docs, causal=True)
    assert torch.equal(eager, attend(q, k, v, **documents(lengths, lengths), causal=True))


def test_varlen_operators_opcheck():
    """torch.library.opcheck: schema, fake implementation (shapes, strides, no host sync),
    autograd registration and AOT dispatch of flashjit::attention_varlen and
    flashjit::attention_varlen_backward (GQA, a 1-row document; no rows past the last document:
    o's are left unwritten, as the eager path's, and opcheck compares whole outputs)."""
    require_cpu_backward()
    lengths = [1, 17, 100, 3]
    q, k, v, do = packed_inputs(lengths, lengths, 4, 2, torch.float32, tag="opcheck")
    cu = offsets(lengths)
    args = (q, k, v, cu, cu, 100, 100, True, None, False, None)
    torch.library.opcheck(torch.ops.flashjit.attention_varlen.default, args)
    o, lse = torch.ops.flashjit.attention_varlen(*args)
    assert lse.shape == (4 * q.shape[0],) and not lse.requires_grad
    detached = tuple(x.detach() for x in (q, k, v, o))
    torch.library.opcheck(torch.ops.flashjit.attention_varlen_backward.default,
                          (do,) + detached + (lse, cu, cu, 100, 100, True, None, False))
    # With a variant's fields (window, softcap).
    torch.library.opcheck(torch.ops.flashjit.attention_varlen.default,
                          args + (6, 0, 3.0))


# ---- CUDA ------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cuda_compiled_documents_match_the_reference_and_the_eager_path(causal):
    """The CUDA twin: bf16, head_dim 128, GQA, documents of 1, 17, 100 and 3 rows (and 5 spare),
    compiled (fullgraph) against eager (the forward bitwise; the gradients, from atomics, each
    against the fp64 per-document reference); opcheck of both operators."""
    require_gpu()
    lengths = [1, 17, 100, 3]
    q, k, v, do = packed_inputs(lengths, lengths, 8, 2, torch.bfloat16, device="cuda",
                                head_dim=128, spare=5, tag="cuda")
    docs = documents(lengths, lengths, "cuda")
    compiled, eager = compiled_and_eager(q, k, v, do, docs, causal)
    rows = sum(lengths)
    assert torch.equal(compiled[0][:rows], eager[0][:rows])
    for run in (compiled, eager):
        check_against_reference(run[0], run[1:], q, k, v, do, lengths, lengths, causal)
    # opcheck compares whole outputs: no rows past the last document (o's are left unwritten).
    q, k, v, do = packed_inputs(lengths, lengths, 8, 2, torch.bfloat16, device="cuda",
                                head_dim=128, tag="cuda-opcheck")
    cu = docs["cu_seqlens_q"]
    args = (q, k, v, cu, cu, 100, 100, causal, None, False, None)
    torch.library.opcheck(torch.ops.flashjit.attention_varlen.default, args)
    o, lse = torch.ops.flashjit.attention_varlen(*args)
    torch.library.opcheck(torch.ops.flashjit.attention_varlen_backward.default,
                          (do, q.detach(), k.detach(), v.detach(), o.detach(), lse, cu, cu, 100,
                           100, causal, None, False))
