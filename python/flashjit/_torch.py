"""flashjit for PyTorch: autograd, torch.compile, the SDPA drop-in and the fast path of torch
tensors (imported by flashjit when it first sees a torch tensor, or when torch was imported
before flashjit).

Differentiable attention, three ways in, one implementation (_forward / _backward below):
  * eager, no gradient needed:  _forward() directly;
  * eager, gradient needed:     _Attention (a torch.autograd.Function) around _forward/_backward;
  * torch.compile / export:     the custom operators flashjit::attention and
    flashjit::attention_backward (torch.library.custom_op: a fake implementation for tracing,
    register_autograd for the gradient), which call the same two functions.
Eager calls do not go through the custom operators because their dispatch costs more host time
than the whole call otherwise does (measured on the CPU with torch 2.15: +24 us per call without
autograd, +57 us with it, against 7 us for the call): bench/host_overhead.py.

The fast path: per (shapes, strides, dtypes, devices, options) of the inputs, the extension's
checks, problem and kernel are resolved once (_C.prepare_attention: a _C.Prepared); a call then
allocates the outputs with torch and launches with data pointers on torch's current stream.
Inputs the kernels cannot read as they are (last axis not contiguous, other strides not multiples
of 8 elements, data not 16-byte aligned) are copied contiguous first.

The forward saves only q, k, v, its output and the log-sum-exp (as FlashAttention does); the
backward recomputes the probabilities. The log-sum-exp output is not differentiable.

Attention variants (window, softcap, ALiBi, prefix, score_mod / mask_mod: flashjit._variant_spec's
tuple, with score_mod_grad as a 7th field when given, plus the slopes tensor) run on the same
three paths, forward and backward: the backward gets the forward's variant (and the score_mod's
derivative); the forward kernel's variant leaves score_mod_grad out (_forward_variant). ALiBi's
slopes get no gradient: slopes that require grad raise UnsupportedError (_refuse_slopes_grad)
rather than record a node whose gradient would silently be None.

Packed variable-length documents (cu_seqlens) have their own two ways in, on the extension's
varlen forward and backward (_varlen_forward / _varlen_backward, not the prepared calls): eager
with a gradient needed, _VarlenAttention; under torch.compile / export, with or without one, the
custom operators flashjit::attention_varlen and flashjit::attention_varlen_backward (the offsets
are tensor inputs, max_seqlen_q / _k ints that a traced call must be given). Eager calls without
a gradient take flashjit._attention_varlen's DLPack path.
"""
import atexit
from typing import Optional, Tuple

import torch

from . import _flashjit as _C

# Whether torch.compile / torch.export is tracing the call (flashjit/__init__.py asks here).
compiling = torch.compiler.is_compiling

# key -> _Plan; cleared with the runtimes (flashjit.tune serves new configs afterwards).
_PLANS = {}


def clear_plans():
    _PLANS.clear()


# Prepared calls hold kernels: released before the interpreter tears the extension down.
atexit.register(clear_plans)


try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # int handle, no Stream object
except AttributeError:  # a torch built without CUDA
    _raw_stream = None


def _stream(x):
    """torch's current stream of x's device as an int (0 on the CPU)."""
    index = x.get_device()
    if index < 0:
        return 0
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _readable(x):
    """True when the kernels can read x's layout: a contiguous last axis and the other strides
    multiples of 8 elements (strides of size-1 axes do not matter)."""
    shape, strides = x.shape, x.stride()
    if len(shape) != 4:
        return True  # the extension names the bad ndim
    if shape[3] > 1 and strides[3] != 1:
        return False
    return all(shape[i] == 1 or strides[i] % 8 == 0 for i in range(3))


def _copy(x):
    """A fresh contiguous (so aligned and readable) copy of x."""
    return x.clone(memory_format=torch.contiguous_format)


def _new_like(x):
    """An uninitialized output with x's shape and dtype in x's memory order of the seqlen and
    heads axes: SDPA-layout (bhsd) views of bshd memory (q.transpose(1, 2)) get bshd memory back,
    so that the caller's o.transpose(1, 2).contiguous() copies nothing (as with torch SDPA)."""
    shape = x.shape
    if len(shape) == 4 and shape[1] > 1 and shape[2] > 1 and x.stride(1) < x.stride(2):
        return x.new_empty((shape[0], shape[2], shape[1], shape[3])).transpose(1, 2)
    return x.new_empty(shape)


def _new_lse(q, shape):
    """An uninitialized float32 log-sum-exp, (batch, heads, seqlen_q), contiguous."""
    return q.new_empty(shape, dtype=torch.float32)


def _lse_shape(shape, layout):
    """(batch, heads, seqlen_q) of q's shape in `layout`."""
    if len(shape) != 4 or layout not in ("bshd", "bhsd"):
        raise _C.InvalidArgumentError(
            f"q.shape = {tuple(shape)}, layout = {layout!r}: expected 4-D tensors and layout "
            f"'bshd' (batch, seqlen, heads, head_dim) or 'bhsd' (batch, heads, seqlen, head_dim)")
    return (shape[0], shape[2], shape[1]) if layout == "bshd" else (shape[0], shape[1], shape[2])


class _Plan:
    """A prepared forward (or backward) call and which inputs to copy first."""
    __slots__ = ("prepared", "copies", "lse_shape", "backwards")

    def __init__(self, prepared, copies, lse_shape=None):
        self.prepared = prepared
        self.copies = copies  # a bool per input, in argument order
        self.lse_shape = lse_shape
        self.backwards = {}  # (do.stride(), deterministic) -> _Plan, for _Attention.backward


def _aligned(*tensors):
    for x in tensors:
        if x.data_ptr() & 15:
            return False
    return True


def _slopes_key(alibi_slopes):
    """What the prepared checks of ALiBi's slopes depend on (None: no ALiBi)."""
    if alibi_slopes is None:
        return None
    return (alibi_slopes.shape, alibi_slopes.stride(), alibi_slopes.dtype, alibi_slopes.device)


def _forward_variant(variant):
    """The variant as the forward kernel compiles it: without score_mod_grad (the backward's)."""
    if variant is None or len(variant) == 6:
        return variant
    return None if variant[:6] == _PLAIN_FIELDS[:6] else variant[:6]


def _forward(q, k, v, causal, scale, layout, config, variant=None, alibi_slopes=None):
    """(o, lse, plan, (q, k, v, o) as launched): the forward on torch tensors, fast path. o is in
    q's memory order (as the fake implementation's); the launched tensors are those the plan's
    kernel read and wrote (copies where q, k or v were unreadable or misaligned): the eager
    backward, keyed on the plan, reads them. variant, alibi_slopes: an attention variant
    (flashjit._variant_spec's tuple, the slopes tensor)."""
    variant = _forward_variant(variant)
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype,
           v.dtype, q.device, k.device, v.device, causal, scale, layout, config)
    if variant is not None or alibi_slopes is not None:  # (plain calls keep their short key)
        key += (variant, _slopes_key(alibi_slopes))
    plan = _PLANS.get(key)
    # o in the memory order of q as given (copied or not): what the fake implementation says.
    o = _new_like(q)
    if plan is None:
        copies = tuple(not _readable(x) for x in (q, k, v))
        q, k, v = (_copy(x) if c else x for x, c in zip((q, k, v), copies))
        lse_shape = _lse_shape(q.shape, layout)
        prepared = _C.prepare_attention(q, k, v, o, None, causal, scale, layout, config, variant,
                                        alibi_slopes)
        plan = _PLANS[key] = _Plan(prepared, copies, lse_shape)
    elif True in plan.copies:
        q, k, v = (_copy(x) if c else x for x, c in zip((q, k, v), plan.copies))
    if not _aligned(q, k, v):  # rare: realigned copies, the output copied into o's order
        q, k, v = (x if x.data_ptr() & 15 == 0 else _copy(x) for x in (q, k, v))
        aligned_o, lse, plan, launched = _forward(q, k, v, causal, scale, layout, config, variant,
                                                  alibi_slopes)
        return o.copy_(aligned_o), lse, plan, launched
    lse = _new_lse(q, plan.lse_shape)
    plan.prepared.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                          0 if alibi_slopes is None else alibi_slopes.data_ptr(), _stream(q))
    return o, lse, plan, (q, k, v, o)


def _backward(do, q, k, v, o, lse, causal, scale, layout, deterministic, forward_plan=None,
              variant=None, alibi_slopes=None):
    """(dq, dk, dv) on torch tensors, fast path. With `forward_plan` (the eager autograd path),
    q, k, v, o and lse are that forward's tensors and do has o's shape, dtype and device (autograd
    guarantees it), so do's strides (and the variant's score_mod_grad) complete the key. variant,
    alibi_slopes: the forward's (with score_mod_grad for a score_mod)."""
    if forward_plan is not None:
        key = (do.stride(), deterministic, variant)
        cache = forward_plan.backwards
    else:
        key = (do.shape, do.stride(), q.shape, q.stride(), k.shape, k.stride(), v.shape,
               v.stride(), o.shape, o.stride(), lse.shape, lse.stride(), do.dtype, q.dtype,
               k.dtype, v.dtype, o.dtype, lse.dtype, do.device, q.device, k.device, v.device,
               o.device, lse.device, causal, scale, layout, deterministic)
        if variant is not None or alibi_slopes is not None:  # (plain calls keep their short key)
            key += (variant, _slopes_key(alibi_slopes))
        cache = _PLANS
    plan = cache.get(key)
    inputs = (do, q, k, v, o, lse)
    # The gradients in the memory order of q, k, v as given, as the fake implementation says.
    dq, dk, dv = _new_like(q), _new_like(k), _new_like(v)
    if plan is None:
        copies = tuple(not _readable(x) for x in inputs[:5]) + (not lse.is_contiguous(),)
        do, q, k, v, o, lse = (_copy(x) if c else x for x, c in zip(inputs, copies))
        prepared = _C.prepare_attention_backward(q, k, v, o, lse, do, dq, dk, dv, causal, scale,
                                                 layout, deterministic, None, variant,
                                                 alibi_slopes)
        plan = cache[key] = _Plan(prepared, copies)
    elif True in plan.copies:
        do, q, k, v, o, lse = (_copy(x) if c else x for x, c in zip(inputs, plan.copies))
    if not _aligned(do, q, k, v, o):  # (lse, float32, needs 4 bytes: any float32 tensor has it)
        do, q, k, v, o = (x if x.data_ptr() & 15 == 0 else _copy(x) for x in (do, q, k, v, o))
        grads = _backward(do, q, k, v, o, lse, causal, scale, layout, deterministic,
                          variant=variant, alibi_slopes=alibi_slopes)
        return tuple(mine.copy_(grad) for mine, grad in zip((dq, dk, dv), grads))
    plan.prepared.backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                           do.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                           0 if alibi_slopes is None else alibi_slopes.data_ptr(), _stream(q))
    return dq, dk, dv


# --- eager autograd ---------------------------------------------------------------------------

class _Attention(torch.autograd.Function):
    """softmax(scale q k^T + mask) v with FlashAttention-2's backward; saves q, k, v, o, lse."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, layout, deterministic, config, variant=None,
                alibi_slopes=None):
        o, lse, plan, launched = _forward(q, k, v, causal, scale, layout, config, variant,
                                          alibi_slopes)
        ctx.save_for_backward(*launched, lse)
        ctx.options = (causal, scale, layout, deterministic)
        ctx.plan = plan
        ctx.variant = variant
        ctx.alibi_slopes = alibi_slopes  # (no gradient: attention() refuses slopes that need one)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        # ctx.plan is the plan of the tensors saved (their own key when the forward copied or
        # realigned any): the recursion in _forward returns the plan it launched with.
        dq, dk, dv = _backward(do, q, k, v, o, lse, *ctx.options, forward_plan=ctx.plan,
                               variant=ctx.variant, alibi_slopes=ctx.alibi_slopes)
        return dq, dk, dv, None, None, None, None, None, None, None


def _varlen_forward(q, k, v, causal, scale, config, variant, alibi_slopes, documents):
    """(o, lse) of packed documents: the extension's varlen forward (flashjit._attention_varlen
    without autograd), o (total_q, heads, head_dim) contiguous, lse float32 (heads * total_q,).
    `documents`: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    from . import _attention_varlen

    with torch.no_grad():
        return _attention_varlen(q, k, v, causal, scale, "bshd", None, True, None, config, None,
                                 False, _forward_variant(variant), alibi_slopes, *documents)


def _varlen_backward(do, q, k, v, o, lse, causal, scale, deterministic, variant, alibi_slopes,
                     documents):
    """(dq, dk, dv) of packed documents (torch.zeros_like q, k, v: the rows past the last
    document get no gradient, the kernels leave them): the extension's varlen backward."""
    from . import _attention_backward

    dq, dk, dv = (torch.zeros_like(x) for x in (q, k, v))
    # do may be a broadcast view (sum().backward()): the kernels read a contiguous last axis.
    _attention_backward(q, k, v, o, lse, do.contiguous(), causal, scale, "bshd", deterministic,
                        dq, dk, dv, None, None, variant, alibi_slopes, documents)
    return dq, dk, dv


class _VarlenAttention(torch.autograd.Function):
    """Packed variable-length documents (flashjit.attention with cu_seqlens_q / _k) in eager
    mode: _varlen_forward and _varlen_backward (the extension's varlen calls, not the prepared
    calls of the fast path); saves q, k, v, o, lse. `documents`: (cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k), checked."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, deterministic, config, variant, alibi_slopes,
                documents):
        o, lse = _varlen_forward(q, k, v, causal, scale, config, variant, alibi_slopes,
                                 documents)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = (causal, scale, deterministic, variant, alibi_slopes, documents)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        causal, scale, deterministic, variant, alibi_slopes, documents = ctx.options
        dq, dk, dv = _varlen_backward(do, *ctx.saved_tensors, causal, scale, deterministic,
                                      variant, alibi_slopes, documents)
        return dq, dk, dv, None, None, None, None, None, None, None


# --- custom operators (torch.compile, torch.export) -------------------------------------------

# The variant travels through the operator as its fields (a schema has no mixed tuples):
# window_left, window_right, softcap, prefix, score_mod, mask_mod, score_mod_grad, then the
# slopes tensor.
_PLAIN_FIELDS = (-1, -1, None, 0, "", "", "")


def _variant_fields(variant):
    if variant is None:
        return _PLAIN_FIELDS
    return tuple(variant) + _PLAIN_FIELDS[len(variant):]


def _variant_of(fields):
    """The variant spec of the operator's fields: None, or _variant_spec's tuple (6 fields, 7
    with a score_mod_grad)."""
    fields = tuple(fields)
    if fields == _PLAIN_FIELDS:
        return None
    return fields if fields[6] else fields[:6]


@torch.library.custom_op("flashjit::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 scale: Optional[float], layout: str, deterministic: bool,
                 config: Optional[str], window_left: int = -1, window_right: int = -1,
                 softcap: Optional[float] = None, prefix: int = 0, score_mod: str = "",
                 mask_mod: str = "", score_mod_grad: str = "",
                 alibi_slopes: Optional[torch.Tensor] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): flashjit's forward. deterministic is for the backward (register_autograd); the
    fields after config are the attention variant's (score_mod_grad: the backward's)."""
    variant = _variant_of((window_left, window_right, softcap, prefix, score_mod, mask_mod,
                           score_mod_grad))
    o, lse, _, _ = _forward(q, k, v, causal, scale, layout, config, variant, alibi_slopes)
    return o, lse


@attention_op.register_fake
def _(q, k, v, causal, scale, layout, deterministic, config, window_left=-1, window_right=-1,
      softcap=None, prefix=0, score_mod="", mask_mod="", score_mod_grad="", alibi_slopes=None):
    return _new_like(q), _new_lse(q, _lse_shape(q.shape, layout))


@torch.library.custom_op("flashjit::attention_backward", mutates_args=())
def attention_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          o: torch.Tensor, lse: torch.Tensor, causal: bool,
                          scale: Optional[float], layout: str, deterministic: bool,
                          window_left: int = -1, window_right: int = -1,
                          softcap: Optional[float] = None, prefix: int = 0, score_mod: str = "",
                          mask_mod: str = "", score_mod_grad: str = "",
                          alibi_slopes: Optional[torch.Tensor] = None
                          ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): flashjit's backward (dk, dv summed over each GQA group), of the forward's
    attention variant (the fields after deterministic, as attention_op's)."""
    variant = _variant_of((window_left, window_right, softcap, prefix, score_mod, mask_mod,
                           score_mod_grad))
    return _backward(do, q, k, v, o, lse, causal, scale, layout, deterministic, variant=variant,
                     alibi_slopes=alibi_slopes)


@attention_backward_op.register_fake
def _(do, q, k, v, o, lse, causal, scale, layout, deterministic, window_left=-1, window_right=-1,
      softcap=None, prefix=0, score_mod="", mask_mod="", score_mod_grad="", alibi_slopes=None):
    return _new_like(q), _new_like(k), _new_like(v)


_OP_FIELDS = len(_PLAIN_FIELDS)  # the variant's fields among attention_op's inputs, from 8 on


def _save_variant(ctx, inputs, start):
    """ctx.variant = (the variant's fields, the slopes) of an operator's inputs, the fields from
    index `start` on (defaults left out of `inputs` filled in)."""
    given = tuple(inputs[start:start + _OP_FIELDS])
    fields = given + _PLAIN_FIELDS[len(given):]
    slopes = inputs[start + _OP_FIELDS] if len(inputs) > start + _OP_FIELDS else None
    ctx.variant = (fields, slopes)


def _saved_variant(ctx):
    """ctx.variant, refusing slopes that require grad (flashjit computes no gradient of them)."""
    fields, slopes = ctx.variant
    if slopes is not None and slopes.requires_grad:
        _refuse_slopes_grad(_variant_of(fields), slopes)
    return fields, slopes


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, layout, deterministic, _config = inputs[:8]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.options = (causal, scale, layout, deterministic)
    _save_variant(ctx, inputs, 8)
    ctx.mark_non_differentiable(lse)


def _op_backward(ctx, do, _dlse):
    fields, slopes = _saved_variant(ctx)
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward_op(do, q, k, v, o, lse, *ctx.options, *fields, slopes)
    return (dq, dk, dv) + (None,) * (5 + _OP_FIELDS + 1)


attention_op.register_autograd(_op_backward, setup_context=_setup_context)


# Packed documents: flashjit::attention_varlen and flashjit::attention_varlen_backward, on
# _varlen_forward / _varlen_backward (as _VarlenAttention). The offsets are tensor inputs (no
# gradient); max_seqlen_q / _k ints, None where the traced call was not given them (computing
# them from the offsets while tracing would be a data-dependent host read, a graph break): the
# operators raise then, at the compiled call's first run (an error raised while dynamo traces
# reaches the caller as dynamo's Unsupported, not as flashjit's error).

def _given_lengths(max_seqlen_q, max_seqlen_k):
    """InvalidArgumentError naming max_seqlen_q / _k when None (see above)."""
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if value is None:
            offsets = "cu_seqlens_" + name[-1]
            raise _C.InvalidArgumentError(
                f"{name} is None under torch.compile: pass {name}= as a Python int (the longest "
                f"document's length), or compute it outside the compiled region (e.g. "
                f"int(({offsets}[1:] - {offsets}[:-1]).max())): computed from {offsets} inside, "
                f"it would be a data-dependent host read of a traced tensor (a graph break)")


@torch.library.custom_op("flashjit::attention_varlen", mutates_args=())
def attention_varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                        max_seqlen_q: Optional[int], max_seqlen_k: Optional[int], causal: bool,
                        scale: Optional[float], deterministic: bool, config: Optional[str],
                        window_left: int = -1, window_right: int = -1,
                        softcap: Optional[float] = None, prefix: int = 0, score_mod: str = "",
                        mask_mod: str = "", score_mod_grad: str = "",
                        alibi_slopes: Optional[torch.Tensor] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(o (total_q, heads, head_dim), lse float32 (heads * total_q,)): flashjit's forward of
    packed documents; the other inputs as attention_op's."""
    _given_lengths(max_seqlen_q, max_seqlen_k)
    variant = _variant_of((window_left, window_right, softcap, prefix, score_mod, mask_mod,
                           score_mod_grad))
    return _varlen_forward(q, k, v, causal, scale, config, variant, alibi_slopes,
                           (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


@attention_varlen_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
      deterministic, config, window_left=-1, window_right=-1, softcap=None, prefix=0,
      score_mod="", mask_mod="", score_mod_grad="", alibi_slopes=None):
    return q.new_empty(q.shape), q.new_empty((q.shape[1] * q.shape[0],), dtype=torch.float32)


@torch.library.custom_op("flashjit::attention_varlen_backward", mutates_args=())
def attention_varlen_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                                 v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                                 cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                                 max_seqlen_q: Optional[int], max_seqlen_k: Optional[int],
                                 causal: bool, scale: Optional[float], deterministic: bool,
                                 window_left: int = -1, window_right: int = -1,
                                 softcap: Optional[float] = None, prefix: int = 0,
                                 score_mod: str = "", mask_mod: str = "",
                                 score_mod_grad: str = "",
                                 alibi_slopes: Optional[torch.Tensor] = None
                                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of packed documents (zero past the last document; dk, dv summed over each
    GQA group), of the forward's variant (the fields after deterministic, as attention_op's)."""
    _given_lengths(max_seqlen_q, max_seqlen_k)
    variant = _variant_of((window_left, window_right, softcap, prefix, score_mod, mask_mod,
                           score_mod_grad))
    return _varlen_backward(do, q, k, v, o, lse, causal, scale, deterministic, variant,
                            alibi_slopes, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k))


@attention_varlen_backward_op.register_fake
def _(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
      deterministic, window_left=-1, window_right=-1, softcap=None, prefix=0, score_mod="",
      mask_mod="", score_mod_grad="", alibi_slopes=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # (as zeros_like)


def _setup_varlen_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = inputs[:7]
    causal, scale, deterministic, _config = inputs[7:11]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.options = (max_seqlen_q, max_seqlen_k, causal, scale, deterministic)
    _save_variant(ctx, inputs, 11)
    ctx.mark_non_differentiable(lse)


def _varlen_op_backward(ctx, do, _dlse):
    fields, slopes = _saved_variant(ctx)
    dq, dk, dv = attention_varlen_backward_op(do, *ctx.saved_tensors, *ctx.options, *fields,
                                              slopes)
    return (dq, dk, dv) + (None,) * (8 + _OP_FIELDS + 1)


attention_varlen_op.register_autograd(_varlen_op_backward, setup_context=_setup_varlen_context)


# --- the public functions' torch paths (flashjit/__init__.py documents them) -------------------

def autocast(q, k, v):
    """Under torch.autocast, float32 inputs are cast to the autocast dtype, as SDPA's are."""
    if q.dtype == torch.float32:
        device_type = q.device.type
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            return q.to(dtype), k.to(dtype), v.to(dtype)
    return q, k, v


def _check_cuda_dtype(q):
    if q.is_cuda and q.dtype == torch.float32:
        raise _C.UnsupportedError(
            "q.dtype = float32 on " + str(q.device) + ": flashjit's CUDA kernels take bfloat16 "
            "or float16. Run the model under torch.autocast('cuda', dtype=torch.bfloat16) (float32 "
            "inputs are then cast, as for torch SDPA), or convert it (model.to(torch.bfloat16)); "
            "float32 runs on the CPU backend only")


def _refuse_slopes_grad(variant, alibi_slopes):
    """UnsupportedError for ALiBi slopes that require grad (flashjit computes no gradient of
    them; None would be silently wrong)."""
    from . import _variant_text

    raise _C.UnsupportedError(
        f"alibi_slopes requires grad ({_variant_text(variant, alibi_slopes)}): flashjit's "
        f"backward computes dq, dk and dv only, not the slopes' gradient; pass "
        f"alibi_slopes.detach() (fixed slopes, as ALiBi's are)")


def attention(q, k, v, causal, scale, layout, return_lse, deterministic, config, variant=None,
              alibi_slopes=None):
    """flashjit.attention for torch tensors without out=, lse= or stream=: differentiable (ALiBi's
    slopes excepted)."""
    q, k, v = autocast(q, k, v)
    _check_cuda_dtype(q)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                              v.requires_grad)
    if variant is not None or alibi_slopes is not None:
        if alibi_slopes is not None and not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError(f"alibi_slopes: expected a torch.Tensor with torch inputs, got "
                            f"{type(alibi_slopes).__module__}.{type(alibi_slopes).__qualname__}")
        if torch.is_grad_enabled() and alibi_slopes is not None and alibi_slopes.requires_grad:
            _refuse_slopes_grad(variant, alibi_slopes)
    if compiling():
        o, lse = attention_op(q, k, v, causal, scale, layout, deterministic, config,
                              *_variant_fields(variant), alibi_slopes)
    elif needs_grad:
        o, lse = _Attention.apply(q, k, v, causal, scale, layout, deterministic, config, variant,
                                  alibi_slopes)
    else:
        o, lse, _, _ = _forward(q, k, v, causal, scale, layout, config, variant, alibi_slopes)
    return (o, lse) if return_lse else o


def attention_varlen(q, k, v, causal, scale, return_lse, deterministic, config, variant,
                     alibi_slopes, documents):
    """flashjit.attention of packed documents for torch tensors (without out=, lse= or stream=)
    that need a gradient (_VarlenAttention) or that torch.compile traces (the custom operator
    flashjit::attention_varlen): differentiable (ALiBi's slopes excepted)."""
    q, k, v = autocast(q, k, v)
    _check_cuda_dtype(q)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    if torch.is_grad_enabled() and alibi_slopes is not None and alibi_slopes.requires_grad:
        _refuse_slopes_grad(variant, alibi_slopes)
    if compiling():
        o, lse = attention_varlen_op(q, k, v, *documents, causal, scale, bool(deterministic),
                                     config, *_variant_fields(variant), alibi_slopes)
    else:
        o, lse = _VarlenAttention.apply(q, k, v, causal, scale, bool(deterministic), config,
                                        variant, alibi_slopes, documents)
    return (o, lse) if return_lse else o


def attention_backward(q, k, v, o, lse, do, causal, scale, layout, deterministic, variant=None,
                       alibi_slopes=None):
    """flashjit.attention_backward for torch tensors without dq=, dk=, dv=, config= or stream=
    (lse given)."""
    q, k, v, o, lse, do = (x.detach() for x in (q, k, v, o, lse, do))
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.detach()
    return _backward(do, q, k, v, o, lse, causal, scale, layout, deterministic, variant=variant,
                     alibi_slopes=alibi_slopes)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False, variant=None, alibi_slopes=None):
    """torch.nn.functional.scaled_dot_product_attention's signature and semantics on flashjit
    (flashjit/__init__.py documents it)."""
    if attn_mask is not None:
        raise _C.UnsupportedError(
            "flashjit.sdpa: attn_mask is not supported: flashjit computes full or causal "
            "attention only (is_causal=True for the causal mask); use "
            "torch.nn.functional.scaled_dot_product_attention for other masks")
    if dropout_p != 0.0:
        raise _C.UnsupportedError(
            f"flashjit.sdpa: dropout_p = {dropout_p}: flashjit has no attention dropout; pass "
            f"dropout_p=0.0 (set the model's attention dropout to 0)")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"flashjit.sdpa: {name} must be a torch.Tensor, got "
                            f"{type(x).__module__}.{type(x).__qualname__} (flashjit.attention "
                            f"takes other arrays)")
        if x.dim() != 4:
            raise _C.InvalidArgumentError(
                f"flashjit.sdpa: {name}.shape = {tuple(x.shape)}: must be 4-D, (batch, heads, "
                f"seqlen, head_dim)")
    heads_q, heads_kv = query.shape[1], key.shape[1]
    if heads_q != heads_kv and not enable_gqa:
        raise _C.InvalidArgumentError(
            f"flashjit.sdpa: query has {heads_q} heads and key {heads_kv}: pass enable_gqa=True "
            f"for grouped-query attention (as torch SDPA asks)")
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]

    def run(q, k, v, causal):
        return attention(q, k, v, causal, scale, "bhsd", False, None, None, variant, alibi_slopes)

    if not is_causal or seqlen_q == seqlen_k:
        return run(query, key, value, is_causal)
    if variant is not None or alibi_slopes is not None:
        from . import _variant_text

        raise _C.UnsupportedError(
            f"flashjit.sdpa: is_causal with seqlen_q = {seqlen_q} != seqlen_k = {seqlen_k} and an "
            f"attention variant ({_variant_text(variant, alibi_slopes)}): SDPA aligns that causal "
            f"mask top-left, flashjit's variants bottom-right; use flashjit.attention(..., "
            f"causal=True, layout='bhsd') for the bottom-right alignment")
    # SDPA's causal mask with seqlen_q != seqlen_k is aligned top-left (query i sees keys
    # 0..i); flashjit's bottom-right. Top-left is bottom-right on the square top-left block of
    # the scores, and full attention for the rows below it.
    if seqlen_q < seqlen_k:
        return run(query, key[:, :, :seqlen_q], value[:, :, :seqlen_q], True)
    head = run(query[:, :, :seqlen_k], key, value, True)
    tail = run(query[:, :, seqlen_k:], key, value, False)
    return torch.cat((head, tail), dim=2)
