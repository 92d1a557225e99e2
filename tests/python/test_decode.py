"""flashjit.decode: attention against a contiguous or paged K/V cache with per-sequence lengths,
against the fp64 reference (each sequence on its own keys), on the CPU backend (every build with
one) and on a CUDA device (torch, skipped without one)."""
import numpy as np
import pytest

import flashjit
from conftest import (reference_attention, relative_error, lse_error, require_cpu_backend,
                      require_gpu, seed)

MAX_REL = {np.float32: 1e-4, np.float16: 1e-2}


def paged_cache(rng, lengths, heads_kv, head_dim, page_size, dtype, spare_pages=3):
    """(k_cache, v_cache, block_table, per-sequence contiguous k and v): each sequence's pages
    shuffled through the cache, spare pages filled with NaN (never to be read)."""
    max_pages = max(1, max((n + page_size - 1) // page_size for n in lengths))
    num_pages = len(lengths) * max_pages + spare_pages
    shape = (num_pages, page_size, heads_kv, head_dim)
    k_cache = np.full(shape, np.nan, dtype)
    v_cache = np.full(shape, np.nan, dtype)
    order = rng.permutation(num_pages)
    table = np.zeros((len(lengths), max_pages), np.int32)
    keys, values = [], []
    for b, n in enumerate(lengths):
        k = rng.standard_normal((n, heads_kv, head_dim)).astype(dtype)
        v = rng.standard_normal((n, heads_kv, head_dim)).astype(dtype)
        for j in range(max_pages):
            page = order[b * max_pages + j]
            table[b, j] = page
            rows = slice(j * page_size, min(n, (j + 1) * page_size))
            if rows.start < n:
                k_cache[page, :rows.stop - rows.start] = k[rows]
                v_cache[page, :rows.stop - rows.start] = v[rows]
        keys.append(k)
        values.append(v)
    return k_cache, v_cache, table, keys, values


def reference_per_sequence(q, keys, values, causal, lengths):
    """fp64 out and lse of each sequence b: q[b] against its first lengths[b] keys."""
    outs, lses = [], []
    for b, n in enumerate(lengths):
        o, lse = reference_attention(q[b:b + 1], keys[b][None, :n], values[b][None, :n],
                                     causal=causal)
        outs.append(o)
        lses.append(lse)
    return np.concatenate(outs), np.concatenate(lses)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("seqlen_q,causal", [(1, False), (3, True), (17, True)])
def test_paged_cache_matches_the_reference(dtype, seqlen_q, causal):
    require_cpu_backend()
    rng = np.random.default_rng(seed("paged", dtype, seqlen_q, causal))
    lengths = [17, 1, 64, 33]  # page_size +- 1, one key, whole pages
    heads_q, heads_kv, d, page_size = 8, 2, 64, 16
    lengths = [max(n, seqlen_q) if causal else n for n in lengths]
    k_cache, v_cache, table, keys, values = paged_cache(rng, lengths, heads_kv, d, page_size,
                                                        dtype)
    q = rng.standard_normal((len(lengths), seqlen_q, heads_q, d)).astype(dtype)
    out = np.full(q.shape, np.nan, dtype)  # poisoned: every element must be written
    out, lse = flashjit.decode(q, k_cache, v_cache, block_table=table,
                               seqlens_k=np.array(lengths, np.int32), causal=causal, out=out,
                               return_lse=True)
    ref, ref_lse = reference_per_sequence(q, keys, values, causal, lengths)
    assert relative_error(out, ref) < MAX_REL[dtype]
    assert lse_error(lse, ref_lse) < 1e-3


def test_contiguous_cache_with_and_without_lengths():
    require_cpu_backend()
    rng = np.random.default_rng(seed("contiguous"))
    batch, capacity, heads_q, heads_kv, d = 3, 300, 4, 4, 64
    q = rng.standard_normal((batch, 1, heads_q, d)).astype(np.float32)
    k = rng.standard_normal((batch, capacity, heads_kv, d)).astype(np.float32)
    v = rng.standard_normal((batch, capacity, heads_kv, d)).astype(np.float32)
    # Without seqlens_k: every key of the cache.
    ref, _ = reference_attention(q, k, v)
    assert relative_error(flashjit.decode(q, k, v), ref) < 1e-4
    # With: each sequence's first keys; the rest of its rows poisoned.
    lengths = [1, 17, capacity]
    for b, n in enumerate(lengths):
        k[b, n:] = np.nan
        v[b, n:] = np.nan
    out = flashjit.decode(q, k, v, seqlens_k=np.array(lengths, np.int32))
    ref, _ = reference_per_sequence(q, list(k), list(v), False, lengths)
    assert relative_error(out, ref) < 1e-4


def test_bad_decode_arrays_are_typed_errors():
    q = np.zeros((2, 1, 4, 64), np.float16)
    cache = np.zeros((5, 16, 4, 64), np.float16)
    table = np.zeros((2, 2), np.int32)
    lengths = np.ones(2, np.int32)

    def error(kind, fragment, **kwargs):
        arguments = dict(block_table=table, seqlens_k=lengths)
        arguments.update(kwargs)
        with pytest.raises(kind) as info:
            k_cache = arguments.pop("k_cache", cache)
            flashjit.decode(q, k_cache, arguments.pop("v_cache", k_cache), **arguments)
        assert fragment in str(info.value), str(info.value)
        assert info.value.code == kind.code

    error(flashjit.InvalidArgumentError, "seqlens_k is None: a paged cache", seqlens_k=None)
    error(flashjit.InvalidArgumentError, "block_table.dtype = int64: must be int32",
          block_table=table.astype(np.int64))
    error(flashjit.InvalidArgumentError, "block_table.shape = (3, 2): must be (batch, max_pages)",
          block_table=np.zeros((3, 2), np.int32))
    error(flashjit.InvalidArgumentError, "seqlens_k.shape = (3,): must be (2,)",
          seqlens_k=np.ones(3, np.int32))
    error(flashjit.InvalidArgumentError, "block_table must be contiguous",
          block_table=np.zeros((2, 4), np.int32)[:, ::2])
    error(flashjit.InvalidArgumentError, "page_size 24 (axis 1) must be a multiple of 16",
          k_cache=np.zeros((5, 24, 4, 64), np.float16))
    error(flashjit.InvalidArgumentError, "v_cache.shape = (5, 16, 4, 64): must equal k_cache",
          k_cache=np.zeros((5, 32, 4, 64), np.float16), v_cache=cache)


def test_paged_cache_on_the_gpu():
    require_gpu()
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed("paged-gpu"))
    lengths = [4097, 1, 1000, 17]
    k_cache, v_cache, table, keys, values = paged_cache(rng, lengths, 8, 128, 64, np.float32)
    q = rng.standard_normal((len(lengths), 1, 32, 128)).astype(np.float32)
    cuda = dict(device="cuda", dtype=torch.bfloat16)
    as_bf16 = [torch.from_numpy(x).to(**cuda) for x in (q, k_cache, v_cache)]
    with torch.inference_mode():
        out = flashjit.decode(*as_bf16, block_table=torch.from_numpy(table).cuda(),
                              seqlens_k=torch.tensor(lengths, dtype=torch.int32, device="cuda"))
    # The reference on the bf16-rounded inputs.
    rounded = [x.float().cpu().numpy() for x in as_bf16]
    keys = [rounded[1][table[b]].reshape(-1, 8, 128) for b in range(len(lengths))]
    values = [rounded[2][table[b]].reshape(-1, 8, 128) for b in range(len(lengths))]
    ref, _ = reference_per_sequence(rounded[0], keys, values, False, lengths)
    assert relative_error(out.float().cpu().numpy(), ref) < 1e-2


def checked_case(dtype=np.float32):
    rng = np.random.default_rng(seed("checked-tables", dtype))
    lengths = [17, 40, 5]
    k_cache, v_cache, table, keys, values = paged_cache(rng, lengths, 2, 64, 16, dtype)
    q = rng.standard_normal((len(lengths), 1, 4, 64)).astype(dtype)
    return q, k_cache, v_cache, table, np.array(lengths, np.int32), keys, values


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_check_tables_names_the_first_bad_entry_on_the_cpu(how, monkeypatch):
    """check_tables=True (or FLASHJIT_CHECK_TABLES=1): an out-of-range page, a negative length
    and a length past the table are refused before the kernel reads them (issue 33)."""
    require_cpu_backend()
    q, k_cache, v_cache, table, lengths, keys, values = checked_case()
    kwargs = {"check_tables": True} if how == "argument" else {}
    if how == "environment":
        monkeypatch.setenv("FLASHJIT_CHECK_TABLES", "1")
    out = flashjit.decode(q, k_cache, v_cache, block_table=table, seqlens_k=lengths, **kwargs)
    ref, _ = reference_per_sequence(q, keys, values, False, lengths)
    assert relative_error(out, ref) < MAX_REL[np.float32]
    num_pages, max_pages = k_cache.shape[0], table.shape[1]
    bad = table.copy()
    bad[1, 2] = num_pages
    with pytest.raises(flashjit.InvalidArgumentError,
                       match=rf"block_table\[1\]\[2\] = {num_pages}: must be a page in "
                             rf"\[0, {num_pages}\) \(num_pages\), used by seqlens_k\[1\] = 40"):
        flashjit.decode(q, k_cache, v_cache, block_table=bad, seqlens_k=lengths, **kwargs)
    for b, length in [(2, -1), (0, max_pages * 16 + 1)]:
        bad_lengths = lengths.copy()
        bad_lengths[b] = length
        with pytest.raises(flashjit.InvalidArgumentError,
                           match=rf"seqlens_k\[{b}\] = {length}: must be in \[0, {max_pages * 16}\]"):
            flashjit.decode(q, k_cache, v_cache, block_table=table, seqlens_k=bad_lengths,
                            **kwargs)


GPU_BAD_CALL = r"""
import sys
import numpy as np
import torch
import flashjit
from test_decode import checked_case
q, k_cache, v_cache, table, lengths, _, _ = checked_case()
cuda = dict(device="cuda", dtype=torch.bfloat16)
if sys.argv[1] == "page":
    table[1, 2] = 1000
else:
    lengths[2] = -4
with torch.inference_mode():
    out = flashjit.decode(*[torch.from_numpy(x).to(**cuda) for x in (q, k_cache, v_cache)],
                          block_table=torch.from_numpy(table).cuda(),
                          seqlens_k=torch.from_numpy(lengths).cuda(), check_tables=True)
    torch.cuda.synchronize()
print("no error")
"""


def test_check_tables_on_the_gpu():
    """On CUDA the check is a kernel on the call's stream: good tables give the reference (the
    check launched before the decode kernel); a bad entry is printed and traps, so the process
    (a child: the CUDA context is lost) fails at the synchronization."""
    require_gpu()
    torch = pytest.importorskip("torch")
    import os
    import subprocess
    import sys
    q, k_cache, v_cache, table, lengths, keys, values = checked_case()
    cuda = dict(device="cuda", dtype=torch.bfloat16)
    as_bf16 = [torch.from_numpy(x).to(**cuda) for x in (q, k_cache, v_cache)]
    with torch.inference_mode():
        out = flashjit.decode(*as_bf16, block_table=torch.from_numpy(table).cuda(),
                              seqlens_k=torch.from_numpy(lengths).cuda(), check_tables=True)
    rounded = [x.float().cpu().numpy() for x in as_bf16]
    keys = [rounded[1][table[b]].reshape(-1, 2, 64) for b in range(len(lengths))]
    values = [rounded[2][table[b]].reshape(-1, 2, 64) for b in range(len(lengths))]
    ref, _ = reference_per_sequence(rounded[0], keys, values, False, lengths)
    assert relative_error(out.float().cpu().numpy(), ref) < 1e-2
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here] + sys.path))
    for kind, message in [("page", r"block_table[1][2] = 1000: must be a page in [0, "),
                          ("length", r"seqlens_k[2] = -4: must be in [0, ")]:
        child = subprocess.run([sys.executable, "-c", GPU_BAD_CALL, kind], env=env, cwd=here,
                               capture_output=True, text=True, timeout=300)
        assert child.returncode != 0, child.stdout + child.stderr
        assert "no error" not in child.stdout
        assert message in child.stdout + child.stderr, child.stdout + child.stderr
