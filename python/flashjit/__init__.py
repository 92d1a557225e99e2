"""flashjit: run-time-compiled, autotuned FlashAttention, forward and backward.

    import numpy as np, flashjit
    q = np.random.randn(1, 1000, 8, 64).astype(np.float16)   # (batch, seqlen, heads, head_dim)
    k = v = np.random.randn(1, 1000, 2, 64).astype(np.float16)
    o, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)  # numpy in, numpy out
    do = np.random.randn(*o.shape).astype(np.float16)                   # dLoss/dO
    dq, dk, dv = flashjit.attention_backward(q, k, v, o, lse, do, causal=True)

PyTorch: attention() is differentiable for torch tensors (autograd, torch.compile with
fullgraph=True: the custom operator flashjit::attention), and sdpa() is a drop-in for
torch.nn.functional.scaled_dot_product_attention:

    import torch, flashjit
    q, k, v = (torch.randn(2, 8, 256, 64, requires_grad=True) for _ in range(3))  # (B, H, S, D)
    o = flashjit.sdpa(q, k, v, is_causal=True)   # as F.scaled_dot_product_attention(...)
    o.sum().backward()                           # q.grad, k.grad, v.grad from flashjit's backward

Arrays: torch tensors, cupy, jax or numpy arrays (anything with ``__dlpack__`` or the buffer
protocol) are read through DLPack, without copies, where they are. CUDA arrays run on the CUDA
backend of their device (NVRTC-compiled kernels, the device's primary context, the same one torch
and cupy use); CPU arrays run on the CPU backend (a Clang JIT; present when the build found
LLVM/Clang 14). float16 and bfloat16 (numpy has no bfloat16: float16 there).

Layouts, stated per call with ``layout=``:
  "bshd" (the default): (batch, seqlen, heads, head_dim), flash_attn's convention;
  "bhsd": (batch, heads, seqlen, head_dim), torch SDPA's convention.
Any strides work as long as the last (head_dim) axis is contiguous and the other strides are
multiples of 8 elements (e.g. ``q.transpose(1, 2)`` of a BHSD tensor is a valid BSHD view).
GQA/MQA come from the head counts: k and v may have fewer heads than q, dividing them.
Causal masking is aligned bottom-right (FlashAttention-2): query i sees key j iff
j <= i + seqlen_k - seqlen_q.

Streams: torch CUDA tensors run on torch's current stream of their device, cupy arrays on cupy's
current stream, jax arrays on the default stream with the call returning when the kernel is
done; ``stream=`` overrides (an int handle, a torch.cuda.Stream or a cupy Stream). CPU calls are
synchronous.

Autograd (torch tensors): attention() records a node whose backward is flashjit's backward pass
when q, k or v requires grad; the forward saves only q, k, v, o and the log-sum-exp
(FlashAttention's memory), and the log-sum-exp (return_lse=True) is not differentiable. Under
torch.compile / torch.export the call is the custom operator flashjit::attention (with a fake
implementation and its autograd formula; flashjit::attention_backward for the gradients), so
fullgraph=True traces it without a graph break. Under torch.autocast, float32 inputs are cast to
the autocast dtype first (as SDPA's are). float32 CUDA tensors raise UnsupportedError (the CUDA
kernels take bfloat16/float16: use autocast or convert the model); float32 runs on the CPU.
Inputs the kernels cannot read in place (a non-contiguous last axis, other strides not multiples
of 8 elements, misaligned data) are copied first. out=, lse= and stream= are for calls without
autograd.

Attention variants: attention() and sdpa() take window=(left, right) (a sliding
window around the diagonal, -1: that side unbounded; with causal the right side is 0),
softcap=c (scores become c * tanh(s / c)), alibi_slopes= (float32 (heads,) on q's device: the
bias slope * (kv_idx - q_idx)), prefix=P (keys 0..P-1 visible to every query: prefix-LM), and
score_mod= / mask_mod=, one C++ expression each over (score, batch, head, q_idx, kv_idx), e.g.
``score_mod="score - 0.1f * abs(q_idx - kv_idx)"``, ``mask_mod="(q_idx / 2048) == (kv_idx /
2048)"`` (the mask is and-ed with causal and the window). They are compiled into the kernel (the
variant is part of its cache key). Indices are positions in the sequences as given, causal
bottom-right aligned as above. With torch autograd a variant call is differentiable (the CPU
backend and the CUDA mma family have its backward): a score_mod then needs score_mod_grad=, its
derivative d score_mod / d score as one C++ expression over the same variables (``score`` is
score_mod's input; e.g. ``"1.0f"`` for the example above; without it InvalidArgumentError names
it); ALiBi's slopes get no gradient (slopes that require grad raise UnsupportedError). Packed
documents (cu_seqlens) are differentiable (torch autograd through the extension's varlen
backward: the CPU backend and the CUDA mma family), eager and under torch.compile (the custom
operators flashjit::attention_varlen and flashjit::attention_varlen_backward; a compiled call
passes max_seqlen_q / max_seqlen_k as ints).
Bad values (window sides < -1, softcap <= 0 or not finite, slopes of another shape, dtype or
device, an expression that is not one expression or does not compile) raise
InvalidArgumentError (a compile failure: flashjit.Error with code CompileFailed, quoting the
expression and the compiler's first message).

Backward: attention_backward() takes the forward's o and lse (attention(..., return_lse=True))
and the gradient of the output, do, and returns dq, dk, dv (dk, dv summed over the query heads
of each key/value head for GQA). ``deterministic=True`` asks for bitwise reproducible gradients
(a dQ kernel of its own instead of atomics). A variant's backward takes the forward's variant
arguments (and score_mod_grad= with a score_mod).

Configs: attention() uses the config the tuning DB has for the problem on this device (exact, then
the nearest bucket), else the SRAM-formula default; ``config="default"`` forces the default,
``config="m128n64w4s2"`` a given legal config; attention_backward() likewise with the backward's
configs (tuned separately: ``tune(passes=("fwd", "bwd"))``). ``tune()`` fills the DB (as
``flashjit tune``).
Environment variables as for the C++ library: FLASHJIT_DB, FLASHJIT_CACHE_DIR, FLASHJIT_TUNE,
FLASHJIT_LOG (docs/USAGE.md, "Environment").

Context parallelism: flashjit.distributed.ring_attention (torch.distributed, NCCL or gloo) computes
the attention of a sequence split over the ranks of a process group, differentiable
(docs/DISTRIBUTED.md); ``from flashjit import distributed`` imports it.

Errors raise flashjit.Error subclasses carrying the library's message and ``.code``:
InvalidArgumentError and UnsupportedError (both also ValueError), NoDeviceError.
"""

import contextlib as _contextlib
import os as _os
import sys as _sys

from . import _flashjit as _C
from ._flashjit import (  # noqa: F401  (re-exported)
    Error,
    InvalidArgumentError,
    NoDeviceError,
    UnsupportedError,
    __version__,
    have_cpu_backend,
)

# An error raised by this package's Python code carries the same .code as the library's: its
# class's (the library's instances set their own).
InvalidArgumentError.code = "InvalidArgument"
UnsupportedError.code = "Unsupported"
NoDeviceError.code = "NoDevice"

__all__ = [
    "attention",
    "attention_backward",
    "decode",
    "sdpa",
    "config_for",
    "block_mask_stats",
    "show",
    "tune",
    "devices",
    "have_cpu_backend",
    "Error",
    "InvalidArgumentError",
    "UnsupportedError",
    "NoDeviceError",
    "LAYOUTS",
    "__version__",
]

LAYOUTS = ("bshd", "bhsd")

# flashjit._torch (autograd, custom operators, the fast path of torch tensors): imported with
# flashjit when torch already is (so torch.compile finds the operators registered), else on the
# first torch tensor.
_torch_paths = None


def _torch_module():
    global _torch_paths
    if _torch_paths is None:
        from . import _torch

        _torch_paths = _torch
    return _torch_paths


def _clear_runtimes():
    """Forgets every runtime and prepared call: the next call re-reads the tuning DBs."""
    _C.clear_runtimes()
    if _torch_paths is not None:
        _torch_paths.clear_plans()


def _framework(x):
    """'torch', 'numpy', 'cupy', 'jax' or 'other', from the array's type (no imports)."""
    top = type(x).__module__.split(".", 1)[0]
    if top in ("torch", "numpy", "cupy"):
        return top
    if top in ("jax", "jaxlib"):
        return "jax"
    return "other"


def _check_array(name, x):
    if hasattr(type(x), "__dlpack__"):
        return
    try:
        memoryview(x)
    except TypeError:
        raise TypeError(
            f"{name}: expected an array (torch, cupy, jax, numpy: an object with __dlpack__ or "
            f"the buffer protocol), got {type(x).__module__}.{type(x).__qualname__}"
        ) from None


def _all_torch(q, *others):
    """Whether q and the others are torch tensors on q's device: the autograd paths take those
    only; a mix of frameworks or devices goes the DLPack way, whose checks name the odd one out."""
    return _framework(q) == "torch" and all(
        _framework(x) == "torch" and x.device == q.device for x in others)


def _detached(x):
    """x without autograd: torch's __dlpack__ refuses tensors that require grad (the DLPack paths
    are not autograd operations: attention_backward(), config_for(), attention() with out=, lse=
    or stream=). Anything else as it is."""
    return x.detach() if getattr(x, "requires_grad", False) else x


def _forward_outputs(kind, q, inputs, out, lse, return_lse, layout, stream):
    """The DLPack forward's outputs in q's framework: out (q's shape and dtype) and, with
    return_lse, lse when not given (None where the extension allocates: jax, other frameworks),
    the stream handle (the framework's current stream when not given) and whether the call must
    synchronize (jax). Returns (inputs without autograd, out, lse, handle, synchronize)."""
    handle = None if stream is None else _stream_handle(stream)
    synchronize = False
    if kind == "torch":
        torch = _sys.modules["torch"]
        inputs = tuple(_detached(x) for x in inputs)
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if return_lse and lse is None:
            shape = _lse_shape(q, layout)
            if shape is not None:
                lse = torch.empty(shape, dtype=torch.float32, device=q.device)
        if handle is None:
            handle = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else 0
    elif kind in ("numpy", "cupy"):  # one array API; cupy's on q's device and current stream
        xp = _sys.modules[kind]
        with (xp.cuda.Device(q.device.id) if kind == "cupy" else _contextlib.nullcontext()):
            if out is None:
                out = xp.empty(q.shape, dtype=q.dtype)
            if return_lse and lse is None:
                shape = _lse_shape(q, layout)
                if shape is not None:
                    lse = xp.empty(shape, dtype=xp.float32)
            if kind == "cupy" and handle is None:
                handle = xp.cuda.get_current_stream().ptr
    elif kind == "jax":
        if out is not None or lse is not None:
            raise ValueError("out= and lse= are not supported for jax arrays (immutable); "
                             "flashjit allocates the outputs")
        jax = _sys.modules.get("jax")
        if jax is not None:
            # jax runs asynchronously on its own streams: the inputs must be ready, and the
            # result is complete when the call returns (synchronize below).
            jax.block_until_ready(inputs)
        synchronize = True
    return inputs, out, lse, handle, synchronize


def _stream_handle(stream):
    """An int CUstream from an int, a torch.cuda.Stream (.cuda_stream) or a cupy Stream (.ptr)."""
    if isinstance(stream, int):
        return stream
    for attribute in ("cuda_stream", "ptr"):
        handle = getattr(stream, attribute, None)
        if isinstance(handle, int):
            return handle
    raise TypeError(
        f"stream: expected an int handle, a torch.cuda.Stream or a cupy Stream, got "
        f"{type(stream).__module__}.{type(stream).__qualname__}"
    )


def _lse_shape(q, layout):
    """(batch, heads, seqlen_q) of q in `layout`; None when q or layout is malformed (the
    extension reports that)."""
    shape = tuple(q.shape)
    if len(shape) != 4 or layout not in LAYOUTS:
        return None
    return (shape[0], shape[2], shape[1]) if layout == "bshd" else (shape[0], shape[1], shape[2])


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _integer(name, value, traced=False):
    """value as an int (TypeError if it is not an integer), saturated to int64: the library
    checks the range and names the value. traced (torch.compile traces the call): value as it
    is, a dynamic int unspecialized (the traced operator's run saturates it)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__qualname__} {value!r}")
    if traced:
        return value
    return min(max(value.__index__(), _INT64_MIN), _INT64_MAX)


def _variant_spec(window, softcap, prefix, score_mod, mask_mod, score_mod_grad=None):
    """The variant arguments as the extension takes them: None for plain attention, else
    (window_left, window_right, softcap or None, prefix, score_mod, mask_mod) with Python types,
    and score_mod_grad as a 7th field when given (TypeError for a wrong type); the extension
    validates the values. Hashable (a cache key)."""
    if window is None:
        left, right = -1, -1
    else:
        if isinstance(window, (str, bytes)) or not hasattr(window, "__len__") or len(window) != 2:
            raise TypeError(f"window: expected None or (left, right), got {window!r}")
        left, right = _integer("window[0]", window[0]), _integer("window[1]", window[1])
    if softcap is not None:
        if isinstance(softcap, bool):
            raise TypeError(f"softcap: expected a float, got {softcap!r}")
        try:
            softcap = float(softcap)
        except (TypeError, ValueError):
            raise TypeError(f"softcap: expected None or a float, got {type(softcap).__qualname__} "
                            f"{softcap!r}") from None
    prefix = _integer("prefix", prefix)
    for name, expression in (("score_mod", score_mod), ("mask_mod", mask_mod),
                             ("score_mod_grad", score_mod_grad)):
        if expression is not None and not isinstance(expression, str):
            raise TypeError(f"{name}: expected None or a str (one C++ expression), got "
                            f"{type(expression).__qualname__}")
    spec = (left, right, softcap, prefix, score_mod or "", mask_mod or "")
    if score_mod_grad:
        return spec + (score_mod_grad,)
    return None if spec == (-1, -1, None, 0, "", "") else spec


def _variant_text(spec, alibi_slopes):
    """The variant's arguments as a call would spell them (for messages)."""
    parts = []
    if spec is not None:
        left, right, softcap, prefix, score_mod, mask_mod = spec[:6]
        if (left, right) != (-1, -1):
            parts.append(f"window=({left}, {right})")
        if softcap is not None:
            parts.append(f"softcap={softcap}")
        if prefix:
            parts.append(f"prefix={prefix}")
        if score_mod:
            parts.append(f"score_mod={score_mod!r}")
        if mask_mod:
            parts.append(f"mask_mod={mask_mod!r}")
        if len(spec) > 6 and spec[6]:
            parts.append(f"score_mod_grad={spec[6]!r}")
    if alibi_slopes is not None:
        parts.append("alibi_slopes")
    return ", ".join(parts)


def attention(q, k, v, *, causal=False, scale=None, layout="bshd", out=None, return_lse=False,
              lse=None, config=None, stream=None, deterministic=None, window=None, softcap=None,
              alibi_slopes=None, prefix=0, score_mod=None, mask_mod=None, cu_seqlens_q=None,
              cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, score_mod_grad=None):
    """Attention forward: softmax(scale * q k^T + causal mask) v, per head.

    q: (batch, seqlen_q, heads, head_dim) for layout="bshd" (the default), or
       (batch, heads, seqlen_q, head_dim) for layout="bhsd"; k, v likewise with seqlen_k and
       heads_kv dividing heads (GQA/MQA). float16 or bfloat16, all on one device.
    causal: bottom-right aligned causal mask. scale: default 1/sqrt(head_dim).
    out: optional output array (q's shape, dtype and device; any strides with a contiguous last
       axis); allocated in q's framework when None (contiguous, q's layout).
    return_lse: also return the log-sum-exp (float32, (batch, heads, seqlen_q), natural log);
       lse: optional array to write it into.
    config: None (tuned selection), "default" (the SRAM-formula default) or a config name.
    stream: CUDA stream override (int handle, torch.cuda.Stream, cupy Stream).
    deterministic: torch autograd only: the backward's bitwise reproducible variant (default:
       torch.are_deterministic_algorithms_enabled()).
    window, softcap, alibi_slopes, prefix, score_mod, mask_mod: an attention variant (see the
       module's documentation): window=(left, right) with -1 for an unbounded side,
       softcap=float > 0, alibi_slopes=float32 (heads,) array on q's device, prefix=int,
       score_mod= / mask_mod= one C++ expression each. score_mod_grad: torch autograd with a
       score_mod: its derivative d score_mod / d score, one C++ expression over the same
       variables (required there; the forward does not use it).
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: packed variable-length documents
       (flash_attn's varlen convention): q (total_q, heads, head_dim), k and v (total_k, heads_kv,
       head_dim); cu_seqlens_q / _k int32 (num_docs + 1,) on q's device (cu[0] = 0,
       non-decreasing): document b's queries are rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] and see
       only its keys cu_seqlens_k[b]:cu_seqlens_k[b + 1], every index (causal's diagonal, the
       window, the variant's q_idx / kv_idx / batch = b) per document. max_seqlen_q / _k: the
       longest document's lengths (size the launch; computed from the offsets when None, which
       waits for a GPU). The offsets are checked on the CPU backend, not on a GPU (a document
       longer than max_seqlen_q is not fully computed there). out: (total_q, heads, head_dim);
       lse: float32 (heads * total_q,), document b's (heads, len_q(b)) block at
       heads * cu_seqlens_q[b]. Layout "bshd"; torch autograd (the backward of
       attention_backward(..., cu_seqlens_q=, ...)), eager and under torch.compile (the custom
       operator flashjit::attention_varlen; max_seqlen_q / _k must then be given, as ints: None
       raises InvalidArgumentError naming it, at the compiled call's run).
    Returns out, or (out, lse) when return_lse. For torch tensors the call is differentiable
    (see the module's documentation) unless out=, lse= or stream= is given.
    """
    variant = _variant_spec(window, softcap, prefix, score_mod, mask_mod, score_mod_grad)
    if alibi_slopes is not None:
        _check_array("alibi_slopes", alibi_slopes)
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        return _attention_varlen(q, k, v, causal, scale, layout, out, return_lse, lse, config,
                                 stream, deterministic, variant, alibi_slopes, cu_seqlens_q,
                                 cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    kind = _framework(q)
    if _all_torch(q, k, v) and out is None and lse is None and stream is None:
        return _torch_module().attention(q, k, v, causal, scale, layout, return_lse,
                                         deterministic, config, variant, alibi_slopes)
    if deterministic:
        raise InvalidArgumentError(
            "deterministic= applies to the backward of torch autograd calls (torch tensors "
            "without out=, lse= or stream=); pass it to attention_backward() otherwise")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_array(name, x)
    want_lse = bool(return_lse) or lse is not None
    if kind == "torch":
        torch = _sys.modules["torch"]
        explicit = out is not None or lse is not None or stream is not None
        if explicit and torch.is_grad_enabled() and any(
                getattr(x, "requires_grad", False) for x in (q, k, v, alibi_slopes)):
            raise InvalidArgumentError(
                "out=, lse= and stream= do not support autograd, and q, k, v or alibi_slopes "
                "requires grad: leave them out for a differentiable call, or call under "
                "torch.no_grad()")
        alibi_slopes = None if alibi_slopes is None else _detached(alibi_slopes)
    (q, k, v), out, lse, handle, synchronize = _forward_outputs(
        kind, q, (q, k, v), out, lse, return_lse, layout, stream)
    # Outputs the extension allocates (out/lse None here): jax arrays for jax; for other
    # frameworks numpy arrays on the CPU and DLPack capsules on CUDA devices.
    made_out, made_lse = _C.attention(
        q, k, v, out, lse, want_lse, bool(causal), scale, layout, config,
        0 if handle is None else handle, synchronize, "jax" if kind == "jax" else "numpy", variant,
        alibi_slopes)
    if made_out is not None:
        out = made_out
    if made_lse is not None:
        lse = made_lse
    return (out, lse) if return_lse else out


def _longest(name, cu_seqlens):
    """The longest document of offsets `cu_seqlens` (max of the differences; waits for a GPU)."""
    if len(cu_seqlens) < 2:
        raise InvalidArgumentError(f"{name}: expected (num_docs + 1,) offsets with num_docs >= 1, "
                                   f"got {len(cu_seqlens)} entries")
    return max(1, int((cu_seqlens[1:] - cu_seqlens[:-1]).max()))


def _check_varlen(q, k, v, layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  traced=False):
    """The checks of packed variable-length documents' arguments (attention(), config_for()):
    both offsets, (total, heads, head_dim) arrays in layout 'bshd'. Returns the longest
    documents (max_seqlen_q, max_seqlen_k): as given, else from the offsets; when `traced`
    (torch.compile traces the call), None stays None: computing it would be a data-dependent
    host read of a traced tensor (the operator raises, naming it: _torch._given_lengths)."""
    for name, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if x is None:
            raise InvalidArgumentError(
                f"{name} is None: packed variable-length documents need both cu_seqlens_q and "
                f"cu_seqlens_k (int32 (num_docs + 1,) row offsets)")
        _check_array(name, x)
    if layout != "bshd":
        raise InvalidArgumentError(f"layout = {layout!r}: packed variable-length documents are "
                                   f"(total, heads, head_dim) arrays (layout 'bshd')")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_array(name, x)
        if len(x.shape) != 3:
            raise InvalidArgumentError(
                f"{name}.shape = {tuple(x.shape)}: packed variable-length documents take "
                f"(total, heads, head_dim) arrays")

    def longest(argument, given, name, offsets):
        if given is not None:
            return _integer(argument, given, traced)
        return None if traced else _longest(name, offsets)

    return (longest("max_seqlen_q", max_seqlen_q, "cu_seqlens_q", cu_seqlens_q),
            longest("max_seqlen_k", max_seqlen_k, "cu_seqlens_k", cu_seqlens_k))


def _attention_varlen(q, k, v, causal, scale, layout, out, return_lse, lse, config, stream,
                      deterministic, variant, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                      max_seqlen_q, max_seqlen_k):
    """attention() of packed variable-length documents: the extension's forward over the
    (1, total, heads, head_dim) views of q, k, v with the offsets; torch tensors that need a
    gradient (without out=, lse= or stream=), or traced by torch.compile, through _torch's
    autograd node or custom operator."""
    kind = _framework(q)
    explicit = out is not None or lse is not None or stream is not None
    traced = kind == "torch" and not explicit and _torch_module().compiling()
    max_seqlen_q, max_seqlen_k = _check_varlen(q, k, v, layout, cu_seqlens_q, cu_seqlens_k,
                                               max_seqlen_q, max_seqlen_k, traced)
    documents = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if kind == "torch":
        torch = _sys.modules["torch"]
        needs_grad = torch.is_grad_enabled() and any(
            getattr(x, "requires_grad", False) for x in (q, k, v, alibi_slopes))
        if needs_grad and explicit:
            raise InvalidArgumentError(
                "out=, lse= and stream= do not support autograd, and q, k, v or alibi_slopes "
                "requires grad: leave them out for a differentiable call, or call under "
                "torch.no_grad()")
        if needs_grad or traced:
            return _torch_module().attention_varlen(q, k, v, causal, scale, return_lse,
                                                    deterministic, config, variant,
                                                    alibi_slopes, documents)
        if not explicit:  # torch.autocast casts float32 inputs, as on the paths above
            q, k, v = _torch_module().autocast(q, k, v)
        alibi_slopes = None if alibi_slopes is None else _detached(alibi_slopes)
    if deterministic:
        raise InvalidArgumentError(
            "deterministic= applies to the backward of torch autograd calls (torch tensors that "
            "require grad, without out=, lse= or stream=); pass it to attention_backward() "
            "otherwise")
    if out is not None:
        _check_array("out", out)
        if tuple(out.shape) != tuple(q.shape):
            raise InvalidArgumentError(f"out.shape = {tuple(out.shape)}: must be q's, "
                                       f"{tuple(q.shape)}")
        out = out[None]
    if lse is not None:
        _check_array("lse", lse)
        expected = q.shape[0] * q.shape[1]
        if len(lse.shape) != 1 or lse.shape[0] != expected:
            raise InvalidArgumentError(f"lse.shape = {tuple(lse.shape)}: must be "
                                       f"(heads * total_q,) = ({expected},)")
        lse = lse.reshape(1, q.shape[1], q.shape[0])
    want_lse = bool(return_lse) or lse is not None
    (q, k, v), out, lse, handle, synchronize = _forward_outputs(
        kind, q[None], (q[None], k[None], v[None]), out, lse, return_lse, "bshd", stream)
    made_out, made_lse = _C.attention(
        q, k, v, out, lse, want_lse, bool(causal), scale, "bshd", config,
        0 if handle is None else handle, synchronize, "jax" if kind == "jax" else "numpy", variant,
        alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out = (made_out if made_out is not None else out)[0]
    if made_lse is not None:
        lse = made_lse
    return (out, None if lse is None else lse.reshape(-1)) if return_lse else out


def decode(q, k_cache, v_cache, *, seqlens_k=None, block_table=None, causal=False, scale=None,
           out=None, lse=None, return_lse=False, config=None, stream=None, check_tables=False):
    """Attention of new queries against a K/V cache (inference): the decode family (split-KV,
    GQA packing; generator/decode_config.hpp says which problems it takes: a paged cache or
    per-sequence lengths always) where the problem calls for it, the forward's otherwise; every
    backend with a decode template (CUDA, CPU).

    q: (batch, seqlen_q, heads_q, head_dim), float16 or bfloat16 (float32 on the CPU).
    The cache, either contiguous: k_cache, v_cache (batch, seqlen_k, heads_kv, head_dim), with
       seqlens_k (optional) the keys each sequence has (the first seqlens_k[b] rows of its cache);
    or paged (vLLM / FlashInfer layout): k_cache, v_cache (num_pages, page_size, heads_kv,
       head_dim) with page_size a multiple of 16 in [16, 256], block_table int32 (batch,
       max_pages) (row b: the pages of sequence b in order, each in [0, num_pages)) and seqlens_k
       (required).
    seqlens_k: int32 (batch,), each at most the cache's keys per sequence (seqlen_k, or
       max_pages * page_size). block_table and seqlens_k are read on the device, unchecked by
       default (an index out of range reads out of bounds), so a call can be captured in a CUDA
       graph and replayed with new tables and lengths.
    check_tables: check them before the kernel reads them (also FLASHJIT_CHECK_TABLES=1; on by
       default in a debug build of the library): each length in [0, the cache's keys per
       sequence], each page a length uses in [0, num_pages). On the CPU a ValueError naming the
       first bad entry; on CUDA a check kernel on the same stream before the decode kernel (no
       host sync: still graph-safe) that prints the first bad entry and traps: the call's
       synchronization raises and the CUDA context is lost (as after any device fault).
    causal: bottom-right aligned per sequence (query i of n sees keys up to seqlens_k - n + i):
       chunked prefill into a cache. scale: default 1/sqrt(head_dim).
    out, lse, return_lse, config, stream: as for attention(). Not differentiable.
    """
    kind = _framework(q)
    named = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("seqlens_k", seqlens_k),
             ("block_table", block_table))
    for name, x in named:
        if x is not None:
            _check_array(name, x)
    if kind == "torch":
        torch = _sys.modules["torch"]
        if torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for _, x in named):
            raise UnsupportedError(
                "flashjit.decode is not differentiable, and an input requires grad: call it "
                "under torch.no_grad() / torch.inference_mode()")
    (q, k_cache, v_cache), out, lse, handle, synchronize = _forward_outputs(
        kind, q, (q, k_cache, v_cache), out, lse, return_lse, "bshd", stream)
    made_out, made_lse = _C.decode(
        q, k_cache, v_cache, block_table, seqlens_k, out, lse, bool(return_lse) or lse is not None,
        bool(causal), scale, config, 0 if handle is None else handle, synchronize,
        "jax" if kind == "jax" else "numpy", bool(check_tables))
    if made_out is not None:
        out = made_out
    if made_lse is not None:
        lse = made_lse
    return (out, lse) if return_lse else out


def attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, layout="bshd",
                       deterministic=False, dq=None, dk=None, dv=None, config=None, stream=None,
                       window=None, softcap=None, alibi_slopes=None, prefix=0, score_mod=None,
                       mask_mod=None, score_mod_grad=None, cu_seqlens_q=None, cu_seqlens_k=None,
                       max_seqlen_q=None, max_seqlen_k=None):
    """Attention backward: the gradients dq, dk, dv of a loss L given do = dL/do, where
    o = attention(q, k, v, causal=causal, scale=scale) (FlashAttention-2's algorithm: the
    probabilities are recomputed from q, k and the forward's log-sum-exp, never stored).

    q, k, v: the forward's inputs, as for attention() (same layout, causal and scale).
    o, lse: the forward's output and log-sum-exp: o, lse = attention(q, k, v, ...,
       return_lse=True); o has q's shape and dtype, lse is float32 (batch, heads, seqlen_q).
    do: dL/do, with o's shape and dtype (any strides with a contiguous last axis).
    deterministic: bitwise reproducible gradients (configs with a separate dQ kernel only, no
       atomics; somewhat slower).
    dq, dk, dv: optional arrays to write into (q's, k's and v's shape and dtype, any strides with
       a contiguous last axis); allocated in q's framework when None (contiguous, q's layout).
       For GQA/MQA dk and dv are summed over the query heads that share a key/value head.
    config: None (the tuning DB's backward config, else the default), "default" or a backward
       config name (e.g. "m64n128w8s2", or "m64n128w8s2-det" with a separate dQ kernel).
    stream: CUDA stream override, as for attention().
    window, softcap, alibi_slopes, prefix, score_mod, mask_mod: the forward's attention variant,
       as for attention(); score_mod_grad: with a score_mod (required), d score_mod / d score.
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: packed variable-length documents, as
       for attention(): q, o, do (and dq) (total_q, heads, head_dim), k, v (dk, dv) (total_k,
       heads_kv, head_dim), lse the forward's packed (heads * total_q,); each document's
       gradients are those of its own attention (rows past the last document: dq, dk, dv left as
       they were).
    Returns (dq, dk, dv).
    """
    variant = _variant_spec(window, softcap, prefix, score_mod, mask_mod, score_mod_grad)
    documents = None
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        documents = (cu_seqlens_q, cu_seqlens_k) + _check_varlen(
            q, k, v, layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return _attention_backward(q, k, v, o, lse, do, causal, scale, layout, deterministic, dq, dk,
                               dv, config, stream, variant, alibi_slopes, documents)


def _attention_backward(q, k, v, o, lse, do, causal, scale, layout, deterministic, dq, dk, dv,
                        config, stream, variant, alibi_slopes, documents):
    """attention_backward() with the variant as _variant_spec's tuple and packed documents as
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) (checked; None: none)."""
    if alibi_slopes is not None:
        _check_array("alibi_slopes", alibi_slopes)
    kind = _framework(q)
    if (documents is None and lse is not None and _all_torch(q, k, v, o, lse, do) and
            dq is None and dk is None and dv is None and config is None and stream is None):
        return _torch_module().attention_backward(q, k, v, o, lse, do, causal, scale, layout,
                                                  bool(deterministic), variant, alibi_slopes)
    for name, x in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do)):
        _check_array(name, x)
    if lse is not None:
        _check_array("lse", lse)
    handle = None if stream is None else _stream_handle(stream)
    synchronize = False
    if kind == "torch":
        torch = _sys.modules["torch"]
        q, k, v, o, do = (_detached(x) for x in (q, k, v, o, do))
        lse = None if lse is None else _detached(lse)
        alibi_slopes = None if alibi_slopes is None else _detached(alibi_slopes)
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if dq is None else dq
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device) if dk is None else dk
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device) if dv is None else dv
        if handle is None:
            handle = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else 0
    elif kind == "numpy":
        np = _sys.modules["numpy"]
        dq = np.empty(q.shape, dtype=q.dtype) if dq is None else dq
        dk = np.empty(k.shape, dtype=k.dtype) if dk is None else dk
        dv = np.empty(v.shape, dtype=v.dtype) if dv is None else dv
    elif kind == "cupy":
        cupy = _sys.modules["cupy"]
        with cupy.cuda.Device(q.device.id):
            dq = cupy.empty(q.shape, dtype=q.dtype) if dq is None else dq
            dk = cupy.empty(k.shape, dtype=k.dtype) if dk is None else dk
            dv = cupy.empty(v.shape, dtype=v.dtype) if dv is None else dv
            if handle is None:
                handle = cupy.cuda.get_current_stream().ptr
    elif kind == "jax":
        if dq is not None or dk is not None or dv is not None:
            raise ValueError("dq=, dk= and dv= are not supported for jax arrays (immutable); "
                             "flashjit allocates the gradients")
        jax = _sys.modules.get("jax")
        if jax is not None:
            jax.block_until_ready((q, k, v, o, lse, do))
        synchronize = True
    given = (dq, dk, dv)
    packed = ()
    if documents is not None:
        # One (1, total, heads, head_dim) sequence each; lse as the forward's (1, heads, total_q).
        for name, x in (("o", o), ("do", do), ("dq", dq), ("dk", dk), ("dv", dv)):
            if x is not None and len(x.shape) != 3:
                raise InvalidArgumentError(
                    f"{name}.shape = {tuple(x.shape)}: packed variable-length documents take "
                    f"(total, heads, head_dim) arrays")
        if lse is not None and (len(lse.shape) != 1 or lse.shape[0] != q.shape[0] * q.shape[1]):
            raise InvalidArgumentError(f"lse.shape = {tuple(lse.shape)}: must be the forward's "
                                       f"(heads * total_q,) = ({q.shape[0] * q.shape[1]},)")
        q, k, v, o, do, dq, dk, dv = (None if x is None else x[None]
                                      for x in (q, k, v, o, do, dq, dk, dv))
        lse = None if lse is None else lse.reshape(1, q.shape[2], q.shape[1])
        packed = documents
    made = _C.attention_backward(
        q, k, v, o, lse, do, dq, dk, dv, bool(causal), scale, layout, bool(deterministic), config,
        0 if handle is None else handle, synchronize, "jax" if kind == "jax" else "numpy", variant,
        alibi_slopes, *packed)
    if documents is not None:
        made = tuple(None if x is None else x[0] for x in made)
    return tuple(mine if fresh is None else fresh for fresh, mine in zip(made, given))


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False, *, window=None, softcap=None, alibi_slopes=None, prefix=0,
         score_mod=None, mask_mod=None, score_mod_grad=None):
    """A drop-in for torch.nn.functional.scaled_dot_product_attention on torch tensors: the same
    signature, (batch, heads, seqlen, head_dim) layout and semantics (scale default
    1/sqrt(head_dim); is_causal with seqlen_q != seqlen_k aligned top-left, as SDPA's; GQA with
    enable_gqa=True), differentiable and traceable by torch.compile as attention() is.
    attn_mask and a non-zero dropout_p raise UnsupportedError (flashjit computes full or causal
    attention without dropout); float32 CUDA tensors raise UnsupportedError outside autocast.

        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # before
        y = flashjit.sdpa(q, k, v, is_causal=True)                    # after

    window=, softcap=, alibi_slopes=, prefix=, score_mod=, mask_mod=, score_mod_grad=: an
    attention variant, as for attention() (differentiable likewise); with is_causal they need
    seqlen_q == seqlen_k (SDPA's top-left causal alignment has no variant kernel).
    """
    variant = _variant_spec(window, softcap, prefix, score_mod, mask_mod, score_mod_grad)
    return _torch_module().sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                enable_gqa, variant, alibi_slopes)


def config_for(q, k, v, *, causal=False, scale=None, layout="bshd", config=None, pass_="fwd",
               deterministic=False, window=None, softcap=None, alibi_slopes=None, prefix=0,
               score_mod=None, mask_mod=None, cu_seqlens_q=None, cu_seqlens_k=None,
               max_seqlen_q=None, max_seqlen_k=None, score_mod_grad=None):
    """The config attention(q, k, v, ...) (pass_="fwd") or attention_backward(q, k, v, ...)
    (pass_="bwd", with its deterministic=) would launch, without launching: a dict with config
    ("m128n64w4s2"), source ("exact" / "nearest" from the tuning DB, "default", or "given"),
    device ("cuda:0", "cpu") and problem (the variant arguments, packed documents included, as
    for attention())."""
    variant = _variant_spec(window, softcap, prefix, score_mod, mask_mod, score_mod_grad)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        max_seqlen_q, max_seqlen_k = _check_varlen(q, k, v, layout, cu_seqlens_q, cu_seqlens_k,
                                                   max_seqlen_q, max_seqlen_k)
        q, k, v = q[None], k[None], v[None]  # one (1, total, heads, head_dim) sequence
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_array(name, x)
    if alibi_slopes is not None:
        _check_array("alibi_slopes", alibi_slopes)
        alibi_slopes = _detached(alibi_slopes)
    q, k, v = (_detached(x) for x in (q, k, v))
    return _C.config_for(q, k, v, bool(causal), scale, layout, config, str(pass_),
                         bool(deterministic), variant, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                         max_seqlen_q or 0, max_seqlen_k or 0)


def block_mask_stats(q, k, v, *, causal=False, scale=None, layout="bshd", config=None,
                     pass_="fwd", deterministic=False, window=None, prefix=0, mask_mod=None):
    """The block map of a mask_mod (issue 31) that the kernel config_for() names would read
    (attention() builds and caches it on its first call of a shape): built now, on the device,
    and waited for. A dict with config, block_m, block_n (its tile), maps (1, or batch x heads
    when the mask_mod names batch or head), build_ms (the build's device time) and the shares of
    its tiles that are empty (never loaded), partial (masked per element) and full (unmasked);
    None when that kernel reads no map (no mask_mod, the CPU backend)."""
    variant = _variant_spec(window, None, prefix, None, mask_mod)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_array(name, x)
    q, k, v = (_detached(x) for x in (q, k, v))
    return _C.block_mask_stats(q, k, v, bool(causal), scale, layout, config, str(pass_),
                               bool(deterministic), variant)


def show(*, head_dim=128, seqlen=4096, seqlen_q=None, seqlen_k=None, batch=2, heads=16,
         kv_heads=None, dtype="bf16", causal=False, scale=None, layout="bshd", config=None,
         arch=None, device="auto", pass_="fwd", deterministic=False):
    """The generated kernel source for a problem (as ``flashjit show``), with a first comment
    line naming the problem, the config, where it came from and the entry points.

    pass_: "fwd" (the forward) or "bwd" (the backward: one source with its preprocess, dK/dV
    and dQ kernels); deterministic: the backward's bitwise reproducible variant.

    device: "auto" (cuda:0 if there is a GPU, else the CPU backend), "cpu", "cuda", "cuda:N";
    the config is that runtime's selection (tuning DB, then default) unless config= is given.
    arch: a table architecture ("sm80", "sm86", "sm89", "sm90") instead of a device: no GPU
    needed, the default config unless config= is given.
    """
    seqlen_q = seqlen if seqlen_q is None else seqlen_q
    seqlen_k = seqlen if seqlen_k is None else seqlen_k
    return _C.show(int(batch), int(heads), None if kv_heads is None else int(kv_heads),
                   int(seqlen_q), int(seqlen_k), int(head_dim), str(dtype), bool(causal), scale,
                   str(layout), config, arch, str(device), str(pass_), bool(deterministic))


def devices():
    """CUDA devices and the host CPU, as dicts (backend, device, name, arch or cores, the
    fingerprint tuning results are stored under; "available" for the CPU backend)."""
    return _C.devices()


def _error(cls, code, message):
    error = cls(message)
    error.code = code
    return error


from ._tune import tune  # noqa: E402  (flashjit tune from Python: python/flashjit/_tune.py)


if "torch" in _sys.modules:
    _torch_module()
