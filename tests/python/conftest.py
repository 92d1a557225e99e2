"""Shared setup of the Python tests (tests/python): a hermetic environment, the fp64 reference and
the skip rules.

Run after `pip install .`: python -m pytest tests/python. CPU tests need the CPU backend (a build
that found LLVM/Clang 14); GPU tests need torch with CUDA and a CUDA device flashjit can use; each
skips with its reason otherwise, except that FLASHJIT_EXPECT_GPU=1 turns a missing GPU into a
failure (as the C++ GPU tests do on the GPU machine).
"""
import importlib.util
import os
import tempfile
import zlib

import numpy as np
import pytest

# Before flashjit creates any runtime: no user tuning DB (nothing read, nothing recorded), none of
# the tuning DBs shipped in the package (flashjit/tuning/) and a kernel cache of this session's
# own unless the caller chose one.
os.environ["FLASHJIT_DB"] = "none"
os.environ["FLASHJIT_SYSTEM_DB"] = "none"
os.environ.pop("FLASHJIT_TUNE", None)
if not os.environ.get("FLASHJIT_CACHE_DIR"):
    os.environ["FLASHJIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="flashjit-pytest-cache-")

import flashjit  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def have_module(name):
    return importlib.util.find_spec(name) is not None


def cuda_devices():
    return [d for d in flashjit.devices() if d["backend"] == "cuda" and "error" not in d]


def torch_cuda_reason():
    """None when torch + CUDA + a flashjit CUDA device are usable, else why not."""
    if not have_module("torch"):
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if not cuda_devices():
        return "flashjit sees no usable CUDA device"
    return None


def require_gpu():
    reason = torch_cuda_reason()
    if reason is None:
        return
    if os.environ.get("FLASHJIT_EXPECT_GPU") == "1":
        pytest.fail(f"FLASHJIT_EXPECT_GPU=1 but {reason}")
    pytest.skip(reason)


def require_cpu_backend():
    if not flashjit.have_cpu_backend():
        pytest.skip("this build has no CPU backend (LLVM/Clang 14 were not found)")


def seed(*parts):
    """A reproducible per-case seed (hash() of strings changes with every process)."""
    return zlib.crc32(repr(parts).encode())


def to_bshd(x, layout):
    return x if layout == "bshd" else np.swapaxes(x, 1, 2)


def reference_attention(q, k, v, causal=False, scale=None, layout="bshd"):
    """fp64 attention (numpy): (o in `layout`, lse (batch, heads_q, seqlen_q)).

    GQA by head counts; causal aligned bottom-right (query i sees key j iff
    j <= i + seqlen_k - seqlen_q); a row that sees no key has o = 0 and lse = +inf, as the
    library's reference (tuner/reference.cpp)."""
    return reference_variant_attention(q, k, v, causal=causal, scale=scale, layout=layout)


def relative_error(out, ref):
    out = np.asarray(out, dtype=np.float64)
    assert not np.isnan(out).any(), "NaN in the output"
    assert np.isfinite(out).all(), "inf in the output"
    norm = np.linalg.norm(ref)
    return np.linalg.norm(out - ref) / (norm if norm > 0 else 1.0)


def lse_error(lse, ref):
    """Max |lse - ref| over rows with keys; rows without keys must be +inf in both."""
    lse = np.asarray(lse, dtype=np.float64)
    assert not np.isnan(lse).any(), "NaN in the lse"
    infinite = np.isinf(ref)
    assert np.array_equal(np.isposinf(lse), infinite), "lse: +inf rows differ from the reference"
    if (~infinite).any():
        return float(np.abs(lse[~infinite] - ref[~infinite]).max())
    return 0.0


def reference_gradients(q, k, v, do, causal=False, scale=None, layout="bshd"):
    """fp64 gradients (numpy) of L = sum(do * o) for o = attention(q, k, v): (dq, dk, dv) in
    `layout`, as the library's reference (tuner/reference.cpp) defines them:
      P = softmax(scale q k^T + mask), dV = P^T dO, dP = dO V^T, D = rowsum(dO * O),
      dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q,
    dK and dV summed over the query heads of each key/value head (GQA); rows that see no key
    contribute nothing."""
    q, k, v, do = (to_bshd(np.asarray(x, dtype=np.float64), layout) for x in (q, k, v, do))
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    k_rep = np.repeat(k, group, axis=2)
    v_rep = np.repeat(v, group, axis=2)
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    s = np.einsum("bqhd,bkhd->bhqk", q, k_rep) * scale
    visible = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if causal:
        i = np.arange(seqlen_q)[:, None]
        j = np.arange(seqlen_k)[None, :]
        visible = j <= i + seqlen_k - seqlen_q
    s = np.where(visible, s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    p = np.exp(s - row_max)
    total = p.sum(axis=-1, keepdims=True)
    p = p / np.where(total > 0, total, 1.0)  # rows without keys: all zeros
    o = np.einsum("bhqk,bkhd->bqhd", p, v_rep)
    dv = np.einsum("bhqk,bqhd->bkhd", p, do)
    dp = np.einsum("bqhd,bkhd->bhqk", do, v_rep)
    delta = np.einsum("bqhd,bqhd->bhq", do, o)[..., None]
    ds = p * (dp - delta)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, k_rep) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    # Sum over the group: query head h uses key/value head h // group.
    dk = dk.reshape(batch, seqlen_k, heads_kv, group, head_dim).sum(axis=3)
    dv = dv.reshape(batch, seqlen_k, heads_kv, group, head_dim).sum(axis=3)
    return tuple(to_bshd(x, layout) for x in (dq, dk, dv))


def torch_reference(q, k, v, do, causal=False, scale=None, layout="bshd"):
    """(o, dq, dk, dv) in fp64 torch tensors on q's device, in `layout`: torch.autograd through
    SDPA's math backend of L = sum(do * o), k/v heads repeated for GQA inside the graph (so dk, dv
    sum over the group), an explicit bottom-right causal mask. A row that sees no key contributes
    nothing (the library's convention; SDPA would give NaN there): such rows get all keys in the
    mask and are zeroed in o before the loss, so o and their gradient are exactly zero."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def to_bhsd(x):
        return x.transpose(1, 2) if layout == "bshd" else x

    q, k, v = (to_bhsd(x.detach().double()).requires_grad_() for x in (q, k, v))
    do = to_bhsd(do.detach().double())
    heads_q, heads_kv = q.shape[1], k.shape[1]
    k_rep = k.repeat_interleave(heads_q // heads_kv, dim=1)
    v_rep = v.repeat_interleave(heads_q // heads_kv, dim=1)
    seqlen_q, seqlen_k, head_dim = q.shape[2], k.shape[2], q.shape[3]
    scale = head_dim ** -0.5 if scale is None else scale
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device)
    if causal:
        i = torch.arange(seqlen_q, device=q.device)[:, None]
        j = torch.arange(seqlen_k, device=q.device)[None, :]
        visible = j <= i + seqlen_k - seqlen_q
    has_keys = visible.any(dim=-1)
    mask = visible | ~has_keys[:, None]
    with sdpa_kernel([SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask, scale=scale)
    o = o * has_keys[None, None, :, None]
    (o * do).sum().backward()
    return tuple(to_bhsd(x).detach() for x in (o, q.grad, k.grad, v.grad))


def check_torch_against_reference(o, grads, q, k, v, do, causal, scale=None, layout="bshd",
                                  tolerance=None, forward_floor=None):
    """o and grads = (dq, dk, dv) of flashjit against torch_reference: each gradient within
    `tolerance` (default gradient_tolerance of q's dtype) with q/k/v's shape, dtype and device;
    o within the same tolerance, or max(forward_floor, tolerance / 4) when forward_floor is given
    (the CPU's fp32 forward is far tighter than its gradients)."""
    ref = torch_reference(q, k, v, do, causal=causal, scale=scale, layout=layout)
    tolerance = tolerance or gradient_tolerance(str(q.dtype).replace("torch.", ""))
    o_bound = tolerance if forward_floor is None else max(forward_floor, tolerance / 4)
    assert torch_relative_error(o, ref[0]) < o_bound, "o"
    for name, grad, expected, like in zip(("dq", "dk", "dv"), grads, ref[1:], (q, k, v)):
        assert grad.shape == like.shape and grad.dtype == like.dtype, name
        assert grad.device == like.device, name
        assert torch_relative_error(grad, expected) < tolerance, name


# The smallest root-mean-square a reference is divided by in torch_relative_error. Some exact
# gradients are zero: with one key per query row the softmax has no freedom, dS = P * (dP - D)
# cancels to 0 and so does dq, while a correct kernel leaves its rounding there (~1e-7 in bf16:
# D comes from the rounded O). Measured against a floor of 1e-3 RMS such noise reads ~1e-4 and
# a wrong gradient (RMS ~0.1-1 on these random unit inputs) still reads >= 1e2; every reference
# with content (o and gradients of the test inputs: RMS >= ~3e-2) keeps its own norm.
REFERENCE_RMS_FLOOR = 1e-3


def torch_relative_error(out, ref):
    """Relative L2 error of a torch tensor against an fp64 reference, the reference's norm floored
    at REFERENCE_RMS_FLOOR * sqrt(numel) (an exactly zero reference is judged by the error's RMS
    over that floor); NaN or inf fail."""
    import torch

    out = out.detach().double()
    assert torch.isfinite(out).all(), "NaN or inf"
    floor = REFERENCE_RMS_FLOOR * max(ref.numel(), 1) ** 0.5
    return (torch.linalg.norm(out - ref) / torch.linalg.norm(ref).clamp_min(floor)).item()


def tiny_attention_module(width=64, heads=4, heads_kv=2):
    """A GPT attention block's core (torch.nn.Module, float32, on the CPU): one projection to q,
    k, v (GQA: fewer k/v heads, as views of bshd memory in the bhsd layout), then
    attend(q, k, v, is_causal=True, enable_gqa=True) (flashjit.sdpa or torch SDPA), then the
    output projection. forward(x (batch, seqlen, width), attend)."""
    import torch

    class TinyAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = width // heads
            self.qkv = torch.nn.Linear(width, (heads + 2 * heads_kv) * self.head_dim)
            self.proj = torch.nn.Linear(width, width)

        def forward(self, x, attend):
            batch, seqlen, _ = x.shape
            sizes = [heads * self.head_dim, heads_kv * self.head_dim, heads_kv * self.head_dim]
            q, k, v = (t.view(batch, seqlen, -1, self.head_dim).transpose(1, 2)
                       for t in self.qkv(x).split(sizes, dim=2))
            y = attend(q, k, v, is_causal=True, enable_gqa=True)
            return self.proj(y.transpose(1, 2).reshape(batch, seqlen, width))

    return TinyAttention()


def module_loss_and_grads(model, module, x, attend):
    """[loss, then each parameter's gradient] of mean(module(x, attend)^2), float32 copies;
    module is model or a compiled wrapper of it."""
    model.zero_grad()
    loss = module(x, attend).float().square().mean()
    loss.backward()
    return [loss.detach()] + [p.grad.float().clone() for p in model.parameters()]


def gradient_tolerance(dtype):
    """The relative L2 error a correct backward kernel's gradients stay under, by storage type
    (the library's own, tuner/reference.hpp: bf16 1e-2, fp16 2e-3, fp32 2e-5)."""
    name = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}.get(str(dtype), str(dtype))
    return flashjit._C.gradient_tolerance(name)


def backward_unavailable(error):
    """True for the error a backend gives while its backward template is not there yet (another
    branch writes it): the tests skip then, naming it."""
    return isinstance(error, flashjit.UnsupportedError) and "template yet" in str(error)


def require_cpu_backward():
    """Skips unless the CPU backend runs the backward pass."""
    require_cpu_backend()
    q = np.zeros((1, 1, 1, 64), np.float16)
    lse = np.zeros((1, 1, 1), np.float32)
    try:
        flashjit.attention_backward(q, q, q, q, lse, q)
    except flashjit.UnsupportedError as error:
        if backward_unavailable(error):
            pytest.skip(f"not merged yet: {error}")
        raise


def reference_variant_attention(q, k, v, causal=False, scale=None, layout="bshd", window=None,
                                softcap=None, alibi_slopes=None, prefix=0, score_mod=None,
                                mask_mod=None):
    """fp64 attention with an attention variant (numpy), as generator/problem.hpp's Variant and
    tuner/reference.cpp define it: (o in `layout`, lse (batch, heads_q, seqlen_q)).

    Query row i sees key j iff j < seqlen_k and (j < prefix or j lies in the band
    [i + diagonal - left, i + diagonal + right] (diagonal = seqlen_k - seqlen_q; -1 = that side
    unbounded; causal makes right 0)) and mask_mod(b, h, i, j). A seen key's score is
    s = scale * q . k, then softcap * tanh(s / softcap), + slope[h] * (j - i), then
    score_mod(s, b, h, i, j). score_mod / mask_mod are numpy-vectorized Python equivalents of the
    C++ expressions (broadcast arrays b, h, i, j of shape (batch, heads, seqlen_q, seqlen_k)).
    Rows that see no key: o = 0, lse = +inf."""
    q, k, v = (to_bshd(np.asarray(x, dtype=np.float64), layout) for x in (q, k, v))
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    k = np.repeat(k, group, axis=2)
    v = np.repeat(v, group, axis=2)
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    b = np.arange(batch)[:, None, None, None]
    h = np.arange(heads_q)[None, :, None, None]
    i = np.arange(seqlen_q)[None, None, :, None]
    j = np.arange(seqlen_k)[None, None, None, :]
    left, right = (-1, -1) if window is None else window
    right = 0 if causal else right
    diagonal = seqlen_k - seqlen_q
    in_band = np.ones(s.shape, dtype=bool)
    if left >= 0:
        in_band &= j >= i + diagonal - left
    if right >= 0:
        in_band &= j <= i + diagonal + right
    visible = in_band | (j < prefix)
    if mask_mod is not None:
        visible = visible & np.broadcast_to(mask_mod(b, h, i, j), s.shape)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + np.asarray(alibi_slopes, dtype=np.float64)[None, :, None, None] * (j - i)
    if score_mod is not None:
        s = np.broadcast_to(score_mod(s, b, h, i, j), s.shape)
    s = np.where(visible, s, -np.inf)
    empty = ~visible.any(axis=-1, keepdims=True)  # (batch, heads, seqlen_q, 1)
    row_max = np.where(empty, 0.0, s.max(axis=-1, keepdims=True))
    p = np.exp(s - row_max)
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(empty, 0.0, p / np.where(total > 0, total, 1.0))
        lse = np.where(empty[..., 0], np.inf, np.log(total[..., 0]) + row_max[..., 0])
    o = np.einsum("bhqk,bkhd->bqhd", p, v)
    return to_bshd(o, layout), lse
