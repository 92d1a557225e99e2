"""flash_attn's functions on flashjit: the same names, arguments, defaults, layouts and return
values as the flash_attn package (2.x), so that code written against it switches with one line:

    from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    from flashjit.flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

torch tensors only. Layouts as flash_attn's: q, k, v (batch, seqlen, heads, head_dim) (BSHD);
packed documents (total_tokens, heads, head_dim) with cu_seqlens_q / _k (int32, (batch + 1,)) and
max_seqlen_q / _k; k and v may have fewer heads than q (GQA / MQA). Causal masks and windows are
aligned bottom-right, as flash_attn's: query i sees keys
[i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]].
softcap <= 0 means none (flash_attn's 0.0 default). flash_attn_func, flash_attn_varlen_func and
the packed forms are differentiable (flashjit's backward; deterministic= as flash_attn's) and
traceable by torch.compile(fullgraph=True) (flashjit's custom operators; packed documents need
max_seqlen_q / _k as ints, as flash_attn's take them); flash_attn_with_kvcache is not
differentiable (as flash_attn's).

Return values as flash_attn 2.x: out, or with return_attn_probs=True (out, softmax_lse, None):
flash_attn itself returns the probabilities only with dropout (its S_dmask is None at
dropout_p = 0), and flashjit has no dropout. softmax_lse is float32: (batch, heads, seqlen_q), or
(heads, total_q) for packed documents. flash_attn_with_kvcache: out, or (out, softmax_lse) with
return_softmax_lse=True.

What flashjit does not do raises a typed error naming the argument (flashjit.UnsupportedError,
also a ValueError): dropout_p > 0; ALiBi without causal (or a window whose right side is 0):
flash_attn's bias -slope * |i + seqlen_k - seqlen_q - j| is symmetric, flashjit's
slope * (j - i) one-sided (the two agree on the keys a causal query sees, up to a per-row
constant that this module adds back to softmax_lse); alibi_slopes of shape (batch, heads); in
flash_attn_with_kvcache: rotary_cos / rotary_sin (apply the rotary embedding to q and k first),
cache_batch_idx and cache_leftpad.
"""
import torch

import flashjit as _flashjit
from ._flashjit import InvalidArgumentError, UnsupportedError

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]


# --- argument translation ----------------------------------------------------------------------

def _no_dropout(function, dropout_p):
    if dropout_p is None or float(dropout_p) == 0.0:
        return
    raise UnsupportedError(
        f"{function}: dropout_p = {dropout_p}: flashjit has no attention dropout; pass "
        f"dropout_p=0.0 (evaluation, or a model whose attention dropout is 0)")


def _window(function, window_size):
    """flash_attn's window_size (left, right), -1 unbounded, as flashjit's window= (None when
    both sides are unbounded)."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"{function}: window_size = {window_size!r}: expected (left, right), -1 for an "
            f"unbounded side") from None
    left, right = int(left), int(right)
    return None if (left, right) == (-1, -1) else (left, right)


def _softcap(softcap):
    """flash_attn's softcap (<= 0: none) as flashjit's softcap= (None or > 0)."""
    if softcap is None:
        return None
    softcap = float(softcap)
    return softcap if softcap > 0.0 else None


def _alibi(function, alibi_slopes, causal, window):
    """ALiBi's slopes as flashjit takes them, refusing what flashjit's one-sided bias cannot
    express (see the module's documentation)."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"{function}: alibi_slopes must be a torch.Tensor, got "
                        f"{type(alibi_slopes).__qualname__}")
    if alibi_slopes.dim() != 1:
        raise UnsupportedError(
            f"{function}: alibi_slopes.shape = {tuple(alibi_slopes.shape)}: flashjit takes one "
            f"slope per head, (heads,); per-sequence slopes (batch, heads) are not supported")
    if not causal and (window is None or window[1] != 0):
        raise UnsupportedError(
            f"{function}: alibi_slopes with causal=False and window_size = "
            f"{(-1, -1) if window is None else window}: flashjit's ALiBi bias is "
            f"slope * (j - i), flash_attn's -slope * |i + seqlen_k - seqlen_q - j|; they agree "
            f"only on keys at or left of the diagonal: pass causal=True (or window_size with a "
            f"right side of 0)")
    return alibi_slopes


def _alibi_lse_shift(alibi_slopes, diagonal):
    """What to add to flashjit's log-sum-exp to get flash_attn's under ALiBi: flash_attn's bias is
    flashjit's minus slope * (seqlen_k - seqlen_q) (`diagonal`, a number or a per-row tensor),
    a per-row constant: the output is the same, the log-sum-exp shifts."""
    return -alibi_slopes.float()[:, None] * diagonal


def _check_tensors(function, **tensors):
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{function}: {name} must be a torch.Tensor, got "
                            f"{type(x).__module__}.{type(x).__qualname__}")


def _probs(out, lse, return_attn_probs):
    return (out, lse, None) if return_attn_probs else out


# --- fixed-length batches ----------------------------------------------------------------------

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """flash_attn.flash_attn_func on flashjit: q (batch, seqlen_q, heads, head_dim), k, v
    (batch, seqlen_k, heads_kv, head_dim). Returns out (q's shape), or (out, softmax_lse
    (batch, heads, seqlen_q) float32, None) with return_attn_probs=True. Differentiable."""
    name = "flash_attn_func"
    _check_tensors(name, q=q, k=k, v=v)
    _no_dropout(name, dropout_p)
    window = _window(name, window_size)
    slopes = _alibi(name, alibi_slopes, causal, window)
    out, lse = _flashjit.attention(q, k, v, causal=bool(causal), scale=softmax_scale,
                                   window=window, softcap=_softcap(softcap), alibi_slopes=slopes,
                                   deterministic=bool(deterministic), return_lse=True)
    if slopes is not None and q.dim() == 4 and k.shape[1] != q.shape[1]:
        lse = lse + _alibi_lse_shift(slopes, k.shape[1] - q.shape[1])[None]
    return _probs(out, lse, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """flash_attn_func with kv (batch, seqlen_k, 2, heads_kv, head_dim)."""
    _check_tensors("flash_attn_kvpacked_func", kv=kv)
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """flash_attn_func with qkv (batch, seqlen, 3, heads, head_dim)."""
    _check_tensors("flash_attn_qkvpacked_func", qkv=qkv)
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs)


# --- packed documents --------------------------------------------------------------------------

def _document_of_rows(cu_seqlens, total):
    """(document, position in it) of each of `total` packed rows (rows past the last document:
    the last document, positions past its end), on the offsets' device, without a host read."""
    rows = torch.arange(total, device=cu_seqlens.device, dtype=torch.int64)
    offsets = cu_seqlens.to(torch.int64)
    document = torch.searchsorted(offsets, rows, right=True) - 1
    document = document.clamp(0, offsets.numel() - 2)
    return document, rows - offsets[document]


def _lse_heads_by_rows(lse, cu_seqlens_q, heads, total_q):
    """flashjit's packed log-sum-exp (heads * total_q,): document b's (heads, len_q(b)) block at
    heads * cu_seqlens_q[b], as flash_attn's (heads, total_q). Rows past the last document
    (flash_attn leaves them undefined): +inf, as rows without keys."""
    document, position = _document_of_rows(cu_seqlens_q, total_q)
    offsets = cu_seqlens_q.to(torch.int64)
    length = offsets[document + 1] - offsets[document]
    head = torch.arange(heads, device=lse.device, dtype=torch.int64)[:, None]
    index = heads * offsets[document][None, :] + head * length[None, :] + position[None, :]
    inside = (position < length)[None, :].expand(heads, total_q)
    gathered = lse[index.clamp(0, max(lse.numel() - 1, 0))]
    return torch.where(inside, gathered, torch.full_like(gathered, float("inf")))


def _gather_pages(cache, block_table, cu_seqlens_k, total_k):
    """The packed (total_k, heads_kv, head_dim) keys (or values) of a paged cache (num_pages,
    page_size, heads_kv, head_dim): document b's rows are its first len_k(b) cache rows, pages
    block_table[b] in order (an indexed copy; differentiable in the cache)."""
    page_size = cache.shape[1]
    document, position = _document_of_rows(cu_seqlens_k, total_k)
    pages = block_table.to(torch.int64)[document, position // page_size]
    return cache[pages, position % page_size]


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash_attn.flash_attn_varlen_func on flashjit: q (total_q, heads, head_dim), k, v
    (total_k, heads_kv, head_dim) (or paged caches (num_pages, page_size, heads_kv, head_dim)
    with block_table int32 (batch, max_pages): the keys gathered first, one host read of
    cu_seqlens_k[-1]); cu_seqlens_q / _k int32 (batch + 1,); max_seqlen_q / _k the longest
    documents. Returns out (total_q, heads, head_dim), or (out, softmax_lse (heads, total_q)
    float32, None) with return_attn_probs=True. Differentiable."""
    name = "flash_attn_varlen_func"
    _check_tensors(name, q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    _no_dropout(name, dropout_p)
    window = _window(name, window_size)
    slopes = _alibi(name, alibi_slopes, causal, window)
    if block_table is not None:
        _check_tensors(name, block_table=block_table)
        if k.dim() != 4 or v.dim() != 4 or block_table.dim() != 2:
            raise InvalidArgumentError(
                f"{name}: with block_table, k and v are paged caches (num_pages, page_size, "
                f"heads_kv, head_dim) and block_table (batch, max_pages); got k.shape = "
                f"{tuple(k.shape)}, block_table.shape = {tuple(block_table.shape)}")
        total_k = int(cu_seqlens_k[-1])
        k = _gather_pages(k, block_table, cu_seqlens_k, total_k)
        v = _gather_pages(v, block_table, cu_seqlens_k, total_k)
    out, lse = _flashjit.attention(
        q, k, v, causal=bool(causal), scale=softmax_scale, window=window,
        softcap=_softcap(softcap), alibi_slopes=slopes, deterministic=bool(deterministic),
        return_lse=True, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    if not return_attn_probs:
        return out
    lse = _lse_heads_by_rows(lse.detach(), cu_seqlens_q, q.shape[1], q.shape[0])
    if slopes is not None:
        document, _ = _document_of_rows(cu_seqlens_q, q.shape[0])
        lengths_q = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.int64)
        lengths_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int64)
        lse = lse + _alibi_lse_shift(slopes, (lengths_k - lengths_q)[document][None, :])
    return out, lse, None


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """flash_attn_varlen_func with kv (total_k, 2, heads_kv, head_dim)."""
    _check_tensors("flash_attn_varlen_kvpacked_func", kv=kv)
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func with qkv (total, 3, heads, head_dim), one cu_seqlens."""
    _check_tensors("flash_attn_varlen_qkvpacked_func", qkv=qkv)
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens,
                                  max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


# --- KV cache (inference) ----------------------------------------------------------------------

def _append(cache, new, lengths, block_table):
    """Writes new (batch, seqlen_new, heads_kv, head_dim) into the cache in place at rows
    lengths[b] .. lengths[b] + seqlen_new - 1 of each sequence (contiguous cache: its row b;
    paged: the pages of block_table[b])."""
    batch, seqlen_new = new.shape[0], new.shape[1]
    rows = lengths.to(torch.int64)[:, None] + torch.arange(seqlen_new, device=cache.device)
    if block_table is None:
        cache[torch.arange(batch, device=cache.device)[:, None], rows] = new.to(cache.dtype)
    else:
        page_size = cache.shape[1]
        pages = torch.gather(block_table.to(torch.int64), 1, rows // page_size)
        cache[pages, rows % page_size] = new.to(cache.dtype)


def _decode_takes(k_cache, block_table):
    """Whether flashjit.decode takes this cache (a paged one: page_size a multiple of 16 in
    [16, 256]); otherwise the keys are gathered and attended as packed documents."""
    if block_table is None:
        return True
    page_size = k_cache.shape[1]
    return page_size % 16 == 0 and 16 <= page_size <= 256


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """flash_attn.flash_attn_with_kvcache on flashjit (inference; not differentiable).

    q (batch, seqlen_q, heads, head_dim); k_cache, v_cache (batch, seqlen_cache, heads_kv,
    head_dim), or paged (num_pages, page_size, heads_kv, head_dim) with block_table int32
    (batch, max_pages); cache_seqlens: an int or int32 (batch,), the keys each sequence has in
    the cache (None: all of them). k, v (batch, seqlen_new, heads_kv, head_dim): written into the
    cache in place at cache_seqlens (None with them: the cache's last seqlen_new rows, as
    flash_attn), then attended with it: sequence b sees cache_seqlens[b] + seqlen_new keys,
    causal and the window aligned bottom-right. num_splits is a performance hint (flashjit
    chooses its own split). Plain attention runs flashjit.decode (split-KV); a window, softcap,
    ALiBi or a paged cache whose page size decode does not take, gathers each sequence's keys
    and runs the packed-documents forward. Returns out, or (out, softmax_lse (batch, heads,
    seqlen_q) float32) with return_softmax_lse=True.
    """
    name = "flash_attn_with_kvcache"
    _check_tensors(name, q=q, k_cache=k_cache, v_cache=v_cache)
    for argument, value, hint in (
            ("rotary_cos", rotary_cos, "apply the rotary embedding to q and k before the call"),
            ("rotary_sin", rotary_sin, "apply the rotary embedding to q and k before the call"),
            ("cache_batch_idx", cache_batch_idx, "index the cache before the call "
             "(k_cache[cache_batch_idx]) or keep it in batch order"),
            ("cache_leftpad", cache_leftpad, "keep each sequence's keys from row 0 of its "
             "cache")):
        if value is not None:
            raise UnsupportedError(f"{name}: {argument} is not supported by flashjit: {hint}")
    if (k is None) != (v is None):
        raise InvalidArgumentError(f"{name}: k and v go together: got k "
                                   f"{'None' if k is None else 'given'} and v "
                                   f"{'None' if v is None else 'given'}")
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise InvalidArgumentError(
            f"{name}: q.shape = {tuple(q.shape)}, k_cache.shape = {tuple(k_cache.shape)}: "
            f"expected 4-D tensors (batch, seqlen, heads, head_dim) (a paged cache: (num_pages, "
            f"page_size, heads_kv, head_dim))")
    window = _window(name, window_size)
    slopes = _alibi(name, alibi_slopes, causal, window)
    batch, seqlen_q = q.shape[0], q.shape[1]
    if block_table is not None:
        _check_tensors(name, block_table=block_table)
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            raise InvalidArgumentError(
                f"{name}: block_table.shape = {tuple(block_table.shape)}: expected (batch, "
                f"max_pages) with batch = {batch}")
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if k_cache.shape[0] != batch:
            raise InvalidArgumentError(
                f"{name}: k_cache.shape = {tuple(k_cache.shape)} for a batch of {batch}: a "
                f"contiguous cache has one row per sequence (cache_batch_idx is not supported)")
        capacity = k_cache.shape[1]
    seqlen_new = 0 if k is None else k.shape[1]
    if cache_seqlens is None:
        cache_seqlens = capacity - seqlen_new
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    _check_tensors(name, cache_seqlens=cache_seqlens)
    if cache_seqlens.shape != (batch,):
        raise InvalidArgumentError(f"{name}: cache_seqlens.shape = {tuple(cache_seqlens.shape)}: "
                                   f"expected an int or ({batch},)")
    with torch.no_grad():
        if k is not None:
            _check_tensors(name, k=k, v=v)
            _append(k_cache, k, cache_seqlens, block_table)
            _append(v_cache, v, cache_seqlens, block_table)
        seqlens_k = (cache_seqlens.to(torch.int64) + seqlen_new).to(torch.int32)
        if (window is None and _softcap(softcap) is None and slopes is None and
                _decode_takes(k_cache, block_table)):
            return _flashjit.decode(q, k_cache, v_cache, seqlens_k=seqlens_k,
                                    block_table=block_table, causal=bool(causal),
                                    scale=softmax_scale, return_lse=bool(return_softmax_lse))
        # Each sequence as a document: its queries, its first seqlens_k[b] keys.
        cu_seqlens_k = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
        cu_seqlens_k[1:] = torch.cumsum(seqlens_k, 0)
        cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device) * seqlen_q
        total_k = int(cu_seqlens_k[-1])
        if block_table is None:
            document, position = _document_of_rows(cu_seqlens_k, total_k)
            keys, values = k_cache[document, position], v_cache[document, position]
        else:
            keys = _gather_pages(k_cache, block_table, cu_seqlens_k, total_k)
            values = _gather_pages(v_cache, block_table, cu_seqlens_k, total_k)
        out, lse = _flashjit.attention(
            q.reshape(batch * seqlen_q, *q.shape[2:]), keys, values, causal=bool(causal),
            scale=softmax_scale, window=window, softcap=_softcap(softcap), alibi_slopes=slopes,
            return_lse=True, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=seqlen_q, max_seqlen_k=max(1, int(seqlens_k.max())))
        out = out.reshape(q.shape)
        if not return_softmax_lse:
            return out
        lse = lse.reshape(batch, q.shape[2], seqlen_q)
        if slopes is not None:
            lse = lse + _alibi_lse_shift(slopes, (seqlens_k.to(torch.int64) - seqlen_q)[:, None,
                                                                                      None])
        return out, lse
