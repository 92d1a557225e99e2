"""Packed variable-length documents (flashjit.attention(..., cu_seqlens_q=, cu_seqlens_k=,
max_seqlen_q=, max_seqlen_k=)) on the CPU backend: documents of 1, 17, ~1000 rows, empty ones,
seqlen_q != seqlen_k both ways, GQA, causal, a window + softcap and a mask_mod reading the
document index, against the fp64 reference of each document alone (conftest's
reference_variant_attention on its slices); out poisoned with NaN (every document row written,
the spare rows past the last document untouched); the packed lse layout; typed errors. The
backward likewise (flashjit.attention_backward with the offsets, numpy, both dQ modes): each
document's gradients against conftest's reference_gradients of that document, dq, dk, dv poisoned
(torch autograd of packed documents: test_variants_backward_torch.py)."""
import numpy as np
import pytest

import flashjit
from conftest import (gradient_tolerance, lse_error, reference_gradients,
                      reference_variant_attention, relative_error, require_cpu_backend,
                      require_cpu_backward, seed)

MAX_REL = 1e-2
MAX_LSE = 2e-3


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def reference(q, k, v, cu_q, cu_k, causal, **variant):
    """(o (rows, heads, d), lse (heads * rows,) packed per document) over the document rows."""
    heads = q.shape[1]
    rows = int(cu_q[-1])
    o = np.zeros((rows,) + q.shape[1:])
    lse = np.full(heads * rows, np.inf)
    mask_mod = variant.pop("mask_mod", None)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if q1 == q0 or k1 == k0:
            continue  # no query, or no key: o = 0, lse = +inf
        doc_mask = None if mask_mod is None else (
            lambda _, h, i, j, b=b: mask_mod(b, h, i, j))
        doc_o, doc_lse = reference_variant_attention(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal, mask_mod=doc_mask,
            **variant)
        o[q0:q1] = doc_o[0]
        lse[heads * q0:heads * q1] = doc_lse[0].reshape(-1)
    return o, lse


CASES = [
    # (id, q lengths, k lengths, spare rows, heads_q, heads_kv, causal, variant)
    ("mixed-gqa", [1, 17, 1000, 0, 5, 40], [1, 40, 900, 3, 0, 12], 7, 4, 2, False, {}),
    ("mixed-gqa-causal", [1, 17, 1000, 0, 5, 40], [1, 40, 900, 3, 0, 12], 0, 4, 2, True, {}),
    ("mqa-causal-q>k", [33, 70], [20, 70], 3, 2, 1, True, {}),
    ("window-softcap-mask-mod-of-the-document", [17, 300, 64], [40, 280, 64], 5, 2, 2, True,
     dict(window=(24, 0), softcap=1.5, mask_mod="batch != 1 || (kv_idx % 3) != 0")),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_documents_match_the_reference_per_document(case):
    require_cpu_backend()
    name, q_lengths, k_lengths, spare, heads_q, heads_kv, causal, variant = case
    rng = np.random.default_rng(seed("varlen", name))
    cu_q, cu_k = offsets(q_lengths), offsets(k_lengths)
    total_q, total_k = int(cu_q[-1]) + spare, int(cu_k[-1]) + spare
    q = rng.standard_normal((total_q, heads_q, 64)).astype(np.float16)
    k = rng.standard_normal((total_k, heads_kv, 64)).astype(np.float16)
    v = rng.standard_normal((total_k, heads_kv, 64)).astype(np.float16)
    out = np.full(q.shape, np.nan, dtype=np.float16)  # poisoned
    lse = np.full(heads_q * total_q, np.nan, dtype=np.float32)
    flashjit.attention(q, k, v, causal=causal, out=out, lse=lse, cu_seqlens_q=cu_q,
                       cu_seqlens_k=cu_k, max_seqlen_q=max(q_lengths),
                       max_seqlen_k=max(k_lengths), **variant)
    theirs = dict(variant)
    if "mask_mod" in theirs:
        theirs["mask_mod"] = lambda b, h, i, j: (b != 1) | (j % 3 != 0)
    ref, ref_lse = reference(q, k, v, cu_q, cu_k, causal, **theirs)
    rows = int(cu_q[-1])
    assert relative_error(out[:rows], ref) < MAX_REL
    assert np.all(np.isnan(out[rows:]))  # the spare rows: untouched
    assert lse_error(lse[:heads_q * rows], ref_lse) < MAX_LSE
    # The documents matter: one document of all the rows is a different answer.
    if name.startswith("mixed"):
        merged, _ = reference(q, k, v, offsets([rows]), offsets([int(cu_k[-1])]), causal)
        assert relative_error(out[:rows], merged) > 5 * MAX_REL


def test_defaults_allocate_and_compute_the_longest_document():
    require_cpu_backend()
    rng = np.random.default_rng(seed("varlen-defaults"))
    q = rng.standard_normal((30, 2, 64)).astype(np.float32)
    k = v = rng.standard_normal((25, 2, 64)).astype(np.float32)
    cu_q, cu_k = offsets([10, 20]), offsets([5, 20])
    out, lse = flashjit.attention(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                  return_lse=True)
    assert out.shape == q.shape and lse.shape == (60,)
    ref, ref_lse = reference(q, k, v, cu_q, cu_k, True)
    assert relative_error(out, ref) < 1e-4
    assert lse_error(lse, ref_lse) < 1e-4


@pytest.mark.parametrize("kwargs, words", [
    (dict(cu_seqlens_k=None), ["cu_seqlens_k is None"]),
    (dict(cu_seqlens_q=np.array([0, 4, 8], np.int64)), ["cu_seqlens_q.dtype = int64", "int32"]),
    (dict(cu_seqlens_k=np.array([0, 8], np.int32)), ["cu_seqlens_k.shape = (2,)", "(3,)"]),
    (dict(cu_seqlens_q=np.array([1, 4, 8], np.int32)), ["cu_seqlens_q[0] = 1: must be 0"]),
    (dict(cu_seqlens_q=np.array([0, 3, 2], np.int32)), ["cu_seqlens_q[2] = 2 < cu_seqlens_q[1]"]),
    (dict(cu_seqlens_q=np.array([0, 4, 9], np.int32), max_seqlen_q=5),
     ["past the packed tensor's 8 rows"]),
    (dict(max_seqlen_q=3), ["document 0 has 4 rows", "max_seqlen 3"]),
    (dict(max_seqlen_k=0), ["max_seqlen_k = 0"]),
    (dict(layout="bhsd"), ["layout = 'bhsd'"]),
], ids=lambda x: repr(x)[:40] if isinstance(x, dict) else None)
@pytest.mark.parametrize("entry", ["attention", "config_for"])
def test_bad_arguments_raise_typed_errors(kwargs, words, entry):
    require_cpu_backend()
    q = k = v = np.zeros((8, 2, 64), np.float16)
    call = dict(cu_seqlens_q=offsets([4, 4]), cu_seqlens_k=offsets([4, 4]), max_seqlen_q=4,
                max_seqlen_k=4)
    call.update(kwargs)
    if call["cu_seqlens_k"] is None:
        call.pop("cu_seqlens_k")
    if entry == "config_for" and any(word.startswith(("cu_seqlens_q[", "past", "document"))
                                     for word in words):
        pytest.skip("the offsets' values are checked when a call runs, not by config_for")
    with pytest.raises(flashjit.InvalidArgumentError) as error:
        getattr(flashjit, entry)(q, k, v, **call)
    for word in words:
        assert word in str(error.value)


def test_config_for_names_the_config_the_documents_run():
    require_cpu_backend()
    rng = np.random.default_rng(seed("varlen-config-for"))
    q = rng.standard_normal((30, 2, 64)).astype(np.float32)
    k = v = rng.standard_normal((25, 2, 64)).astype(np.float32)
    cu_q, cu_k = offsets([10, 20]), offsets([5, 20])
    chosen = flashjit.config_for(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert chosen["device"] == "cpu" and "varlen" in chosen["problem"], chosen
    assert chosen["source"] in ("default", "exact", "nearest"), chosen
    out = flashjit.attention(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                             config=chosen["config"])
    assert relative_error(out, reference(q, k, v, cu_q, cu_k, True)[0]) < 1e-4


def test_four_axis_arrays_are_refused():
    require_cpu_backend()
    q = np.zeros((1, 8, 2, 64), np.float16)
    with pytest.raises(flashjit.InvalidArgumentError, match="total, heads, head_dim"):
        flashjit.attention(q, q, q, cu_seqlens_q=offsets([8]), cu_seqlens_k=offsets([8]))


def reference_gradients_per_document(q, k, v, do, cu_q, cu_k, causal):
    """fp64 (dq, dk, dv) over the document rows, each document's gradients of its own attention
    (a document without queries or keys: zeros)."""
    dq = np.zeros((int(cu_q[-1]),) + q.shape[1:])
    dk = np.zeros((int(cu_k[-1]),) + k.shape[1:])
    dv = np.zeros((int(cu_k[-1]),) + v.shape[1:])
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        grads = reference_gradients(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                                    do[None, q0:q1], causal=causal)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = (g[0] for g in grads)
    return dq, dk, dv


BACKWARD_CASES = [
    # (id, q lengths, k lengths, spare rows, heads_q, heads_kv, causal, dtype)
    ("mixed-gqa", [1, 17, 300, 0, 5, 40], [1, 40, 280, 3, 0, 12], 7, 4, 2, False, np.float32),
    ("mixed-gqa-causal", [1, 17, 300, 0, 5, 40], [1, 40, 280, 3, 0, 12], 0, 4, 2, True,
     np.float32),
    ("mqa-causal-q>k-f16", [33, 70], [20, 70], 3, 2, 1, True, np.float16),
]


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "det"])
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=[c[0] for c in BACKWARD_CASES])
def test_backward_matches_the_reference_per_document(case, deterministic):
    require_cpu_backward()
    name, q_lengths, k_lengths, spare, heads_q, heads_kv, causal, dtype = case
    rng = np.random.default_rng(seed("varlen-backward", name))
    cu_q, cu_k = offsets(q_lengths), offsets(k_lengths)
    total_q, total_k = int(cu_q[-1]) + spare, int(cu_k[-1]) + spare
    q = rng.standard_normal((total_q, heads_q, 64)).astype(dtype)
    k = rng.standard_normal((total_k, heads_kv, 64)).astype(dtype)
    v = rng.standard_normal((total_k, heads_kv, 64)).astype(dtype)
    do = rng.standard_normal(q.shape).astype(dtype)
    documents = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(q_lengths),
                     max_seqlen_k=max(k_lengths))
    o, lse = flashjit.attention(q, k, v, causal=causal, return_lse=True, **documents)
    dq = np.full(q.shape, np.nan, dtype=dtype)  # poisoned
    dk = np.full(k.shape, np.nan, dtype=dtype)
    dv = np.full(v.shape, np.nan, dtype=dtype)
    flashjit.attention_backward(q, k, v, o, lse, do, causal=causal, deterministic=deterministic,
                                dq=dq, dk=dk, dv=dv, **documents)
    refs = reference_gradients_per_document(q, k, v, do, cu_q, cu_k, causal)
    rows_q, rows_k = int(cu_q[-1]), int(cu_k[-1])
    for label, mine, ref, rows in (("dq", dq, refs[0], rows_q), ("dk", dk, refs[1], rows_k),
                                   ("dv", dv, refs[2], rows_k)):
        assert relative_error(mine[:rows], ref) < gradient_tolerance(q.dtype), label
        assert np.all(np.isnan(mine[rows:])), label  # the spare rows: untouched
    # Allocated gradients: the same values.
    fresh = flashjit.attention_backward(q, k, v, o, lse, do, causal=causal,
                                        deterministic=deterministic, **documents)
    for mine, given, rows in zip(fresh, (dq, dk, dv), (rows_q, rows_k, rows_k)):
        assert mine.shape == given.shape
        assert relative_error(mine[:rows], given[:rows].astype(np.float64)) < 1e-6


@pytest.mark.parametrize("kwargs, words", [
    (dict(lse=np.zeros(5, np.float32)), ["lse.shape = (5,)", "(heads * total_q,) = (16,)"]),
    (dict(do=np.zeros((1, 8, 2, 64), np.float16)), ["do.shape = (1, 8, 2, 64)"]),
    (dict(cu_seqlens_k=None), ["cu_seqlens_k is None"]),
], ids=lambda x: repr(x)[:40] if isinstance(x, dict) else None)
def test_backward_bad_arguments_raise_typed_errors(kwargs, words):
    require_cpu_backward()
    q = np.zeros((8, 2, 64), np.float16)
    call = dict(lse=np.zeros(16, np.float32), do=q, cu_seqlens_q=offsets([4, 4]),
                cu_seqlens_k=offsets([4, 4]))
    call.update(kwargs)
    if call["cu_seqlens_k"] is None:
        call.pop("cu_seqlens_k")
    lse, do = call.pop("lse"), call.pop("do")
    with pytest.raises(flashjit.InvalidArgumentError) as error:
        flashjit.attention_backward(q, q, q, q, lse, do, **call)
    for word in words:
        assert word in str(error.value)
