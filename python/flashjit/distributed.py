"""Context-parallel (ring) attention over torch.distributed: flashjit's attention of a sequence
split across the ranks of a process group (docs/DISTRIBUTED.md).

    import torch.distributed as dist, flashjit.distributed as fd
    dist.init_process_group("nccl")                  # torchrun; "gloo" on CPUs
    R, r = dist.get_world_size(), dist.get_rank()
    q, k, v = (fd.zigzag_split(x, R, r) for x in (q_full, k_full, v_full))  # (B, S/R, H, D) each
    o = fd.ring_attention(q, k, v, causal=True, split="zigzag")  # this rank's rows of the output
    o.sum().backward()                               # q.grad, k.grad, v.grad of this rank's rows

Each rank holds its slice of q, k and v (the same positions for all three). The K/V slices travel
round the ring (rank r sends to r + 1 and receives from r - 1; torch.distributed's
batch_isend_irecv), the next exchange posted before the current block is computed, so that the
transfer overlaps the attention (on CUDA, ProcessGroupNCCL runs the P2P operations on its own
stream: compute on torch's current stream runs meanwhile, and waiting on a request makes the
current stream wait, not the host). Each block's output and log-sum-exp come from flashjit's
forward (attention(..., return_lse=True)); the partial outputs are merged by their log-sum-exp in
float32. The backward (a torch.autograd.Function) sends K/V round the ring again with their
gradients (float32) travelling behind them, each rank adding its part with flashjit's backward
on the global log-sum-exp, until they return to their owner.

Splits (split=): "contiguous": rank r holds rows [r n, (r + 1) n) of the sequence (n the local
length); "zigzag": the sequence in 2R chunks of n / 2 rows, rank r holding chunks r and 2R-1-r
(in that order), which balances causal work (zigzag_split / zigzag_merge make and undo it).
Each (query chunk, key chunk) pair is computed with the mask it has in global positions: full,
causal (diagonal), a window's band, or skipped, by flashjit's causal / window arguments on the
rows and keys that see something (bottom-right alignment accounted for when they are trimmed).

Supported: causal or not, GQA/MQA (k, v with fewer heads), softmax_scale, layouts "bshd" and
"bhsd", window=(left, right) and softcap (on global positions), ALiBi (alibi_slopes: flashjit's
bias slope * (kv_idx - q_idx) is made global by a per-row correction of each block's log-sum-exp),
float16 / bfloat16 on CUDA, float32 on the CPU. Not supported (UnsupportedError): prefix,
score_mod / mask_mod (their indices would be per block, not global), packed documents
(cu_seqlens), seqlen_q != seqlen_k (cross-attention), gradients of alibi_slopes.

torch.compile: ring_attention is not traced (torch.compiler.disable): a graph break at the call,
the model around it compiled; the collectives stay eager.
"""
import math
from typing import Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import InvalidArgumentError, UnsupportedError
from . import attention as _attention
from . import attention_backward as _attention_backward
from ._torch import autocast as _autocast

__all__ = ["ring_attention", "zigzag_split", "zigzag_merge", "split_sequence", "merge_sequence",
           "SPLITS"]

SPLITS = ("contiguous", "zigzag")
_INF = math.inf


# --- splitting a full sequence ---------------------------------------------------------------

def _check_split(split):
    if split not in SPLITS:
        raise InvalidArgumentError(f"split = {split!r}: expected one of {SPLITS}")


def _check_world(world_size, rank):
    if not isinstance(world_size, int) or world_size < 1:
        raise InvalidArgumentError(f"world_size = {world_size!r}: expected an int >= 1")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise InvalidArgumentError(f"rank = {rank!r}: expected an int in [0, {world_size})")


def zigzag_split(x: torch.Tensor, world_size: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s rows of x (the full sequence along `dim`; 1 for 'bshd', 2 for 'bhsd') in the
    zig-zag split: x in 2 * world_size equal chunks, chunks rank and 2*world_size-1-rank
    concatenated (a new tensor). The length must divide by 2 * world_size."""
    _check_world(world_size, rank)
    length = x.shape[dim]
    if length % (2 * world_size):
        raise InvalidArgumentError(
            f"x.shape[{dim}] = {length}: the zig-zag split needs a length divisible by "
            f"2 * world_size = {2 * world_size}")
    chunks = x.chunk(2 * world_size, dim=dim)
    return torch.cat((chunks[rank], chunks[2 * world_size - 1 - rank]), dim=dim)


def zigzag_merge(parts: Sequence[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's zig-zag part (parts[r] = zigzag_split(x, R, r)):
    zigzag_merge([zigzag_split(x, R, r) for r in range(R)]) equals x."""
    world_size = len(parts)
    if world_size < 1:
        raise InvalidArgumentError("parts: expected one tensor per rank, got none")
    chunks = [None] * (2 * world_size)
    for r, part in enumerate(parts):
        if part.shape[dim] % 2:
            raise InvalidArgumentError(
                f"parts[{r}].shape[{dim}] = {part.shape[dim]}: a zig-zag part holds two chunks "
                f"of equal length (an even length)")
        chunks[r], chunks[2 * world_size - 1 - r] = part.chunk(2, dim=dim)
    return torch.cat(chunks, dim=dim)


def split_sequence(x: torch.Tensor, world_size: int, rank: int, split: str = "contiguous",
                   dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s rows of the full sequence x for `split` ('contiguous' or 'zigzag')."""
    _check_split(split)
    if split == "zigzag":
        return zigzag_split(x, world_size, rank, dim)
    _check_world(world_size, rank)
    if x.shape[dim] % world_size:
        raise InvalidArgumentError(
            f"x.shape[{dim}] = {x.shape[dim]}: the contiguous split needs a length divisible by "
            f"world_size = {world_size}")
    return x.chunk(world_size, dim=dim)[rank]


def merge_sequence(parts: Sequence[torch.Tensor], split: str = "contiguous",
                   dim: int = 1) -> torch.Tensor:
    """The inverse of split_sequence: the full sequence from every rank's part."""
    _check_split(split)
    if split == "zigzag":
        return zigzag_merge(parts, dim)
    return torch.cat(list(parts), dim=dim)


def _segments(split, world_size, rank, length):
    """[(local start, global start, length)] of the rows a rank holds (local order)."""
    if split == "contiguous":
        return ((0, rank * length, length),)
    half = length // 2
    return ((0, rank * half, half), (half, (2 * world_size - 1 - rank) * half, half))


# --- the block plan: which flashjit calls one (query rank, key rank) pair takes ---------------

class _Call:
    """One flashjit call of a block pair: rows [qa, qb) of the local q, keys [ka, kb) of the
    travelling k/v, flashjit's causal and window for them, and for ALiBi the offsets of global
    positions over local indices: q_off as (local start, end, offset) pieces of the rows, k_off
    one offset for all the keys."""
    __slots__ = ("qa", "qb", "ka", "kb", "causal", "window", "q_off", "k_off")

    def __init__(self, qa, qb, ka, kb, causal, window, q_off=(), k_off=0):
        self.qa, self.qb, self.ka, self.kb = qa, qb, ka, kb
        self.causal, self.window, self.q_off, self.k_off = causal, window, q_off, k_off

    def __repr__(self):
        return (f"_Call(q[{self.qa}:{self.qb}], k[{self.ka}:{self.kb}], causal={self.causal}, "
                f"window={self.window})")


def _band(q_seg, k_seg, causal, window):
    """The pair's mask as a band of (j - i) (local row i, key j within the two segments):
    (lo, hi), +-inf for unbounded sides."""
    _, q_global, _ = q_seg
    _, k_global, _ = k_seg
    d = q_global - k_global  # kv_global - q_global = (j - i) - d
    left, right = window if window is not None else (-1, -1)
    lo = d - left if left >= 0 else -_INF
    if causal:
        hi = d  # (flashjit: the right side of a causal window is 0)
    else:
        hi = d + right if right >= 0 else _INF
    return lo, hi


def _pair_call(q_seg, k_seg, causal, window):
    """The flashjit call of one (query segment, key segment) pair, or None when the mask hides
    the whole block. Rows and keys that see nothing are trimmed, then the band [lo, hi] of
    (j - i) is flashjit's window around its bottom-right diagonal (ke - qe of the trimmed
    block)."""
    q_local, q_global, lq = q_seg
    k_local, k_global, lk = k_seg
    lo, hi = _band(q_seg, k_seg, causal, window)
    if lo <= -(lq - 1) and hi >= lk - 1:  # full block
        return _Call(q_local, q_local + lq, k_local, k_local + lk, False, None,
                     ((q_local, q_local + lq, q_global - q_local),), k_global - k_local)
    qs, ks = max(0, -hi), max(0, lo)
    qe = min(lq, lk - lo)
    ke = min(lk, qe + hi)
    qs, qe, ks, ke = (int(x) for x in (max(0, qs), qe, ks, ke))
    if qs >= qe or ks >= ke:
        return None
    diagonal = ke - qe  # flashjit's bottom-right diagonal of the trimmed block, in (j - i)
    left = -1 if lo == -_INF else int(diagonal - lo)
    right = -1 if hi == _INF else int(hi - diagonal)
    assert left >= -1 and right >= -1, (lo, hi, qs, qe, ks, ke)
    if right == 0:
        flash_causal, flash_window = True, (None if left < 0 else (left, 0))
    else:
        flash_causal, flash_window = False, (None if (left, right) == (-1, -1) else (left, right))
    return _Call(q_local + qs, q_local + qe, k_local + ks, k_local + ke, flash_causal,
                 flash_window, ((q_local + qs, q_local + qe, q_global - q_local),),
                 k_global - k_local)


_PLANS = {}


def _plan(q_segs, k_segs, causal, window, alibi):
    """The flashjit calls of a block pair: per segment pair, then merged where one call computes
    the same (the diagonal pair of identical sorted segments without a window: one causal or full
    call; full pairs forming a rectangle: one full call; with ALiBi only over one key segment,
    whose offset must be one constant)."""
    key = (q_segs, k_segs, causal, window, alibi)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    n_q = sum(s[2] for s in q_segs)
    n_k = sum(s[2] for s in k_segs)
    sorted_global = all(a[1] + a[2] <= b[1] for a, b in zip(q_segs, q_segs[1:]))
    if q_segs == k_segs and window is None and not alibi and sorted_global:
        plan = [_Call(0, n_q, 0, n_k, bool(causal), None)]
    else:
        pairs = {(a, b): _pair_call(qs, ks, causal, window)
                 for a, qs in enumerate(q_segs) for b, ks in enumerate(k_segs)}
        live = [p for p, c in pairs.items() if c is not None]
        full = [p for p in live if pairs[p].window is None and not pairs[p].causal and
                pairs[p].qb - pairs[p].qa == q_segs[p[0]][2] and
                pairs[p].kb - pairs[p].ka == k_segs[p[1]][2]]
        rows = sorted({p[0] for p in live})
        cols = sorted({p[1] for p in live})
        rectangle = (live and len(full) == len(live) == len(rows) * len(cols) and
                     rows == list(range(rows[0], rows[-1] + 1)) and
                     cols == list(range(cols[0], cols[-1] + 1)) and (not alibi or len(cols) == 1))
        if rectangle:
            pieces = tuple(piece for a in rows for piece in pairs[(a, cols[0])].q_off)
            plan = [_Call(q_segs[rows[0]][0], q_segs[rows[-1]][0] + q_segs[rows[-1]][2],
                          k_segs[cols[0]][0], k_segs[cols[-1]][0] + k_segs[cols[-1]][2],
                          False, None, pieces, pairs[(rows[0], cols[0])].k_off)]
        else:
            plan = [pairs[p] for p in sorted(live)]
    _PLANS[key] = plan
    return plan


# --- the ring ---------------------------------------------------------------------------------

def _seq_dim(layout):
    return 1 if layout == "bshd" else 2


def _rows(x, dim, a, b):
    return x.narrow(dim, a, b - a)


def _row_lse(lse, layout):
    """lse (B, H, S) as a factor broadcasting over o in `layout`."""
    return (lse.transpose(1, 2) if layout == "bshd" else lse).unsqueeze(-1)


def _alibi_correction(call, slopes):
    """(H, rows) float32: global ALiBi bias minus the call's, per head and row of the call:
    slope * ((global kv - q) - (call-local kv - q)), one value per row."""
    shift = torch.cat([torch.full((b - a,), float(call.k_off + call.ka - off - call.qa),
                                  dtype=torch.float32, device=slopes.device)
                       for a, b, off in call.q_off])
    return slopes.float()[:, None] * shift[None, :]


class _Ring:
    """Posts the exchange of tensors with the ring's neighbours (send to rank + 1, receive from
    rank - 1) and waits for it."""

    def __init__(self, group):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size) \
            if group is not None else (self.rank + 1) % self.size
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size) \
            if group is not None else (self.rank - 1) % self.size

    def exchange(self, tensors):
        """Posts sends of `tensors` and receives into fresh buffers of their shapes: returns
        (requests, buffers)."""
        buffers = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self.prev, self.group) for b in buffers]
        return dist.batch_isend_irecv(ops), buffers

    @staticmethod
    def wait(requests):
        for request in requests:
            request.wait()


def _merge(o_acc, lse_acc, o_part, lse_part, layout, dim, qa, qb):
    """Merges a block's (o_part, lse_part) (rows qa:qb) into the float32 accumulators."""
    lse_rows = lse_acc.narrow(2, qa, qb - qa)
    o_rows = _rows(o_acc, dim, qa, qb)
    lse_part = torch.where(lse_part == _INF, -_INF, lse_part)  # flashjit: +inf = nothing seen
    new = torch.logaddexp(lse_rows, lse_part)
    safe = torch.where(new == -_INF, 0.0, new)
    w_old = torch.exp(lse_rows - safe)
    w_new = torch.exp(lse_part - safe)
    o_rows.mul_(_row_lse(w_old, layout)).add_(o_part.float() * _row_lse(w_new, layout))
    lse_rows.copy_(new)


def _check(q, k, v, layout, ring, check_shapes):
    if layout not in ("bshd", "bhsd"):
        raise InvalidArgumentError(f"layout = {layout!r}: expected 'bshd' or 'bhsd'")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise InvalidArgumentError(
                f"{name}: expected a 4-D torch.Tensor ({layout}), got "
                f"{getattr(x, 'shape', type(x).__qualname__)}")
    dim = _seq_dim(layout)
    if q.shape[dim] != k.shape[dim] or k.shape[dim] != v.shape[dim]:
        raise UnsupportedError(
            f"local seqlen of q = {q.shape[dim]}, k = {k.shape[dim]}, v = {v.shape[dim]}: ring "
            f"attention splits one sequence (self-attention) over the ranks; q, k and v must hold "
            f"the same positions")
    if check_shapes and ring.size > 1:
        mine = torch.tensor(list(q.shape) + list(k.shape), dtype=torch.int64, device=q.device)
        every = [torch.empty_like(mine) for _ in range(ring.size)]
        dist.all_gather(every, mine, group=ring.group)
        for r, theirs in enumerate(every):
            if not torch.equal(theirs, mine):
                raise InvalidArgumentError(
                    f"rank {r} of the group holds q, k of shapes {theirs[:4].tolist()}, "
                    f"{theirs[4:].tolist()}, this rank (rank {ring.rank}) {list(q.shape)}, "
                    f"{list(k.shape)}: every rank must hold the same number of rows")


def _ring_forward(q, k, v, ring, causal, scale, layout, split, window, softcap, slopes):
    dim = _seq_dim(layout)
    n = q.shape[dim]
    q_segs = _segments(split, ring.size, ring.rank, n)
    o_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bshd" else q.shape[:3]
    lse_acc = torch.full(lse_shape, -_INF, dtype=torch.float32, device=q.device)
    kv = [k.contiguous(), v.contiguous()]
    fresh = True  # nothing merged yet
    for step in range(ring.size):
        src = (ring.rank - step) % ring.size
        pending = ring.exchange(kv) if step + 1 < ring.size else None
        k_segs = _segments(split, ring.size, src, n)
        calls = _plan(q_segs, k_segs, causal, window, slopes is not None)
        for call in calls:
            o_part, lse_part = _attention(
                _rows(q, dim, call.qa, call.qb), _rows(kv[0], dim, call.ka, call.kb),
                _rows(kv[1], dim, call.ka, call.kb), causal=call.causal, scale=scale,
                layout=layout, return_lse=True, window=call.window, softcap=softcap,
                alibi_slopes=slopes)
            if slopes is not None:
                lse_part = lse_part + _alibi_correction(call, slopes)[None]
            if ring.size == 1 and (call.qa, call.qb) == (0, n) and len(calls) == 1:
                return o_part, lse_part  # one rank, one call: flashjit's own output
            if fresh and (call.qa, call.qb) == (0, n):  # the first block of every row: a copy
                o_acc.copy_(o_part)
                lse_acc.copy_(torch.where(lse_part == _INF, -_INF, lse_part))
            else:
                _merge(o_acc, lse_acc, o_part, lse_part, layout, dim, call.qa, call.qb)
            fresh = False
        if pending is not None:
            ring.wait(pending[0])
            kv = pending[1]
    o = o_acc.to(q.dtype)
    lse = torch.where(lse_acc == -_INF, _INF, lse_acc)  # flashjit's convention for the backward
    return o, lse


def _ring_backward(do, q, k, v, o, lse, ring, causal, scale, layout, split, window, softcap,
                   slopes, deterministic):
    dim = _seq_dim(layout)
    n = q.shape[dim]
    q_segs = _segments(split, ring.size, ring.rank, n)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = [k.contiguous(), v.contiguous()]
    grads_in = None  # (requests, [dk, dv]) of the block held now, from rank - 1
    for step in range(ring.size):
        src = (ring.rank - step) % ring.size
        pending = ring.exchange(kv) if step + 1 < ring.size else None
        k_segs = _segments(split, ring.size, src, n)
        dk = torch.zeros(kv[0].shape, dtype=torch.float32, device=q.device)
        dv = torch.zeros(kv[1].shape, dtype=torch.float32, device=q.device)
        for call in _plan(q_segs, k_segs, causal, window, slopes is not None):
            lse_rows = lse.narrow(2, call.qa, call.qb - call.qa)
            if slopes is not None:
                lse_rows = lse_rows - _alibi_correction(call, slopes)[None]
            ks = slice(call.ka, call.kb)
            g_q, g_k, g_v = _attention_backward(
                _rows(q, dim, call.qa, call.qb), _rows(kv[0], dim, call.ka, call.kb),
                _rows(kv[1], dim, call.ka, call.kb), _rows(o, dim, call.qa, call.qb), lse_rows,
                _rows(do, dim, call.qa, call.qb), causal=call.causal, scale=scale,
                layout=layout, deterministic=deterministic, window=call.window, softcap=softcap,
                alibi_slopes=slopes)
            _rows(dq, dim, call.qa, call.qb).add_(g_q.float())
            _rows(dk, dim, ks.start, ks.stop).add_(g_k.float())
            _rows(dv, dim, ks.start, ks.stop).add_(g_v.float())
        if grads_in is not None:
            ring.wait(grads_in[0])
            dk.add_(grads_in[1][0])
            dv.add_(grads_in[1][1])
        # The block's gradients go on to the next rank (after the last step: to the owner).
        grads_in = ring.exchange([dk, dv]) if ring.size > 1 else (None, [dk, dv])
        if pending is not None:
            ring.wait(pending[0])
            kv = pending[1]
    if grads_in[0] is not None:
        ring.wait(grads_in[0])
    dk, dv = grads_in[1]
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, causal, scale, layout, split, window, softcap, slopes,
                deterministic):
        with torch.no_grad():
            o, lse = _ring_forward(q, k, v, ring, causal, scale, layout, split, window, softcap,
                                   slopes)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = (ring, causal, scale, layout, split, window, softcap, slopes,
                       deterministic)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        with torch.no_grad():
            dq, dk, dv = _ring_backward(do, q, k, v, o, lse, *ctx.options)
        return (dq, dk, dv) + (None,) * 9


@torch.compiler.disable
def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None, *,
                   causal: bool = False, softmax_scale: Optional[float] = None,
                   layout: str = "bshd", split: str = "contiguous",
                   window: Optional[Tuple[int, int]] = None, softcap: Optional[float] = None,
                   alibi_slopes: Optional[torch.Tensor] = None, return_lse: bool = False,
                   deterministic: bool = False, check_shapes: Optional[bool] = None,
                   prefix: int = 0, score_mod=None, mask_mod=None, cu_seqlens=None):
    """Attention of a sequence split over the ranks of `group` (default: the world).

    q, k, v: this rank's rows of the sequence, (batch, n, heads, head_dim) for layout 'bshd' or
       (batch, heads, n, head_dim) for 'bhsd'; the same n on every rank; k and v may have fewer
       heads (GQA/MQA). split: how the full sequence was split over the ranks: 'contiguous'
       (rank r holds rows [r n, (r + 1) n)) or 'zigzag' (zigzag_split: rank r holds chunks r and
       2R-1-r of 2R chunks; n even; balances causal work).
    causal: the causal mask on global positions (query p sees keys <= p). softmax_scale: default
       1/sqrt(head_dim). window=(left, right), softcap, alibi_slopes: flashjit's variants on
       global positions (alibi_slopes float32 (heads,), no gradient).
    return_lse: also return the log-sum-exp (float32, (batch, heads, n)) of this rank's rows.
    deterministic: the backward's bitwise reproducible flashjit kernels (the ring's order of
       accumulation is fixed).
    check_shapes: compare the shapes of every rank first (an all_gather; default: on CPU
       tensors only, since on CUDA it waits for the device); unequal shapes raise
       InvalidArgumentError instead of hanging or failing in the transport.
    prefix, score_mod, mask_mod, cu_seqlens: not supported across ranks (UnsupportedError).
    Returns this rank's rows of the output (q's shape and dtype), or (o, lse); differentiable
    in q, k and v (torch autograd).
    """
    for name, value in (("prefix", prefix or None), ("score_mod", score_mod),
                        ("mask_mod", mask_mod), ("cu_seqlens", cu_seqlens)):
        if value is not None:
            raise UnsupportedError(
                f"ring_attention: {name} = {value!r} is not supported: "
                + ("packed documents across ranks are not implemented; run each document's "
                   "attention with flashjit.attention(cu_seqlens_q=...) on one rank, or pad "
                   "documents into separate sequences" if name == "cu_seqlens" else
                   "its indices would be positions within each block, not in the global "
                   "sequence; window=, softcap= and alibi_slopes= are supported"))
    _check_split(split)
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError(
            "ring_attention: torch.distributed is not initialized: call "
            "torch.distributed.init_process_group first (torchrun sets up the environment)")
    ring = _Ring(group)
    if check_shapes is None:
        check_shapes = q.device.type == "cpu"
    _check(q, k, v, layout, ring, check_shapes)
    q, k, v = _autocast(q, k, v)  # under torch.autocast: float32 to its dtype, as SDPA does
    dim = _seq_dim(layout)
    if split == "zigzag" and q.shape[dim] % 2:
        raise InvalidArgumentError(
            f"local seqlen n = {q.shape[dim]} with split='zigzag': each rank holds two chunks of "
            f"n / 2 rows, so n must be even")
    if window is not None:
        if (isinstance(window, (str, bytes)) or not hasattr(window, "__len__") or
                len(window) != 2):
            raise TypeError(f"window: expected None or (left, right), got {window!r}")
        window = (int(window[0]), int(window[1]))
        if min(window) < -1:
            raise InvalidArgumentError(
                f"window = {window}: each side must be >= 0, or -1 for unbounded")
        if window == (-1, -1):
            window = None
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError("alibi_slopes: expected a torch.Tensor (float32, (heads,))")
        if alibi_slopes.requires_grad and torch.is_grad_enabled():
            raise UnsupportedError(
                "alibi_slopes requires grad: flashjit computes no gradient of the slopes; pass "
                "alibi_slopes.detach()")
    if softcap is not None:
        softcap = float(softcap)
    o, lse = _RingAttention.apply(q, k, v, ring, bool(causal), softmax_scale, layout, split,
                                  window, softcap, alibi_slopes, bool(deterministic))
    return (o, lse) if return_lse else o
