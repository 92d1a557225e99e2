"""flashjit.attention_backward on CUDA torch tensors against torch's autograd through SDPA's math
backend in fp64: fresh random inputs, odd seqlens, GQA/MQA, both layouts, causal with seqlen_q
!= seqlen_k both ways, poisoned outputs, views, the caller's stream, determinism, device
mismatches. o and lse come from flashjit's forward. Tolerances: the library's
gradient_tolerance (bf16 1e-2, fp16 2e-3 relative L2). Skips without torch + CUDA (fails instead
with FLASHJIT_EXPECT_GPU=1) and while the CUDA backward template is not merged."""
import numpy as np
import pytest

import flashjit
from conftest import (backward_unavailable, gradient_tolerance, require_gpu, seed,
                      torch_reference, torch_relative_error)


def torch_modules():
    require_gpu()
    import torch
    import torch.nn.functional as F

    return torch, F


def backward(*args, **kwargs):
    """attention_backward, skipping the test while the CUDA backward template is missing."""
    try:
        return flashjit.attention_backward(*args, **kwargs)
    except flashjit.UnsupportedError as error:
        if backward_unavailable(error):
            pytest.skip(f"not merged yet: {error}")
        raise


def autograd_reference(q, k, v, do, causal=False, scale=None, layout="bshd"):
    """(dq, dk, dv) in fp64, in `layout` (conftest.torch_reference)."""
    torch_modules()
    return torch_reference(q, k, v, do, causal=causal, scale=scale, layout=layout)[1:]


def relative_error(out, ref):
    torch_modules()
    return torch_relative_error(out, ref)


def shape(layout, batch, seqlen, heads, head_dim):
    if layout == "bshd":
        return (batch, seqlen, heads, head_dim)
    return (batch, heads, seqlen, head_dim)


def randn(shape_, dtype, device="cuda", generator=None):
    torch, _ = torch_modules()
    return torch.randn(shape_, dtype=torch.float32, device=device, generator=generator).to(dtype)


def forward(q, k, v, **kwargs):
    return flashjit.attention(q, k, v, return_lse=True, **kwargs)


CASES = [
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
    (1, 1, 1, 2, 2, 64),
    (2, 17, 17, 8, 2, 128),     # GQA
    (1, 1000, 1000, 4, 1, 64),  # MQA
    (2, 17, 300, 4, 4, 128),    # seqlen_q < seqlen_k
    (1, 300, 17, 4, 2, 256),    # seqlen_q > seqlen_k: causal rows without keys
    (2, 1000, 999, 2, 2, 256),
]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B%d-q%d-k%d-h%d/%d-d%d" % c)
def test_cuda_gradients_match_autograd_fp64(case, dtype_name, causal, layout):
    torch, _ = torch_modules()
    dtype = getattr(torch, dtype_name)
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = case
    generator = torch.Generator(device="cuda").manual_seed(
        seed("backward", case, dtype_name, causal, layout))
    q = randn(shape(layout, batch, seqlen_q, heads_q, head_dim), dtype, generator=generator)
    k = randn(shape(layout, batch, seqlen_k, heads_kv, head_dim), dtype, generator=generator)
    v = randn(shape(layout, batch, seqlen_k, heads_kv, head_dim), dtype, generator=generator)
    do = randn(q.shape, dtype, generator=generator)
    o, lse = forward(q, k, v, causal=causal, layout=layout)
    given = [torch.full_like(x, float("nan")) for x in (q, k, v)]  # poisoned
    result = backward(q, k, v, o, lse, do, causal=causal, layout=layout, dq=given[0],
                      dk=given[1], dv=given[2])
    assert all(r is g for r, g in zip(result, given))
    torch.cuda.synchronize()
    refs = autograd_reference(q, k, v, do, causal=causal, layout=layout)
    for name, grad, ref in zip(("dq", "dk", "dv"), given, refs):
        assert relative_error(grad, ref) < gradient_tolerance(dtype_name), name


def test_allocated_gradients_inputs_requiring_grad_and_scale():
    torch, _ = torch_modules()
    q = randn((2, 77, 8, 128), torch.bfloat16).requires_grad_()
    k = randn((2, 90, 2, 128), torch.bfloat16).requires_grad_()
    v = randn((2, 90, 2, 128), torch.bfloat16).requires_grad_()
    do = randn(q.shape, torch.bfloat16)
    o, lse = forward(q, k, v, causal=True, scale=0.2)
    dq, dk, dv = backward(q, k, v, o, lse, do, causal=True, scale=0.2)
    for grad, like in ((dq, q), (dk, k), (dv, v)):
        assert grad.device == like.device and grad.dtype == like.dtype
        assert grad.shape == like.shape and grad.is_contiguous() and not grad.requires_grad
    refs = autograd_reference(q, k, v, do, causal=True, scale=0.2)
    for grad, ref in zip((dq, dk, dv), refs):
        assert relative_error(grad, ref) < gradient_tolerance("bfloat16")


def test_views_of_the_other_layout():
    """BSHD views of BHSD tensors for every input and BHSD views of BSHD gradient buffers."""
    torch, _ = torch_modules()
    q, do = (randn((2, 8, 129, 64), torch.float16).transpose(1, 2) for _ in range(2))
    k, v = (randn((2, 4, 70, 64), torch.float16).transpose(1, 2) for _ in range(2))
    o, lse = forward(q, k, v, causal=True)
    grads = [torch.empty(x.transpose(1, 2).shape, dtype=x.dtype, device="cuda").transpose(1, 2)
             for x in (q, k, v)]
    backward(q, k, v, o, lse, do, causal=True, dq=grads[0], dk=grads[1], dv=grads[2])
    refs = autograd_reference(q, k, v, do, causal=True)
    for grad, ref in zip(grads, refs):
        assert relative_error(grad, ref) < gradient_tolerance("float16")


def test_deterministic_gradients_are_bitwise_reproducible():
    torch, _ = torch_modules()
    q = randn((2, 1000, 8, 128), torch.bfloat16)
    k, v = (randn((2, 1000, 2, 128), torch.bfloat16) for _ in range(2))
    do = randn(q.shape, torch.bfloat16)
    o, lse = forward(q, k, v, causal=True)
    first = backward(q, k, v, o, lse, do, causal=True, deterministic=True)
    for _ in range(3):
        again = backward(q, k, v, o, lse, do, causal=True, deterministic=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
    chosen = flashjit.config_for(q, k, v, causal=True, pass_="bwd", deterministic=True)
    assert chosen["config"].endswith("-det")
    refs = autograd_reference(q, k, v, do, causal=True)
    for grad, ref in zip(first, refs):
        assert relative_error(grad, ref) < gradient_tolerance("bfloat16")


def test_runs_on_the_callers_stream():
    """do is written on a side stream after a long busy kernel; the backward must run on that
    stream (torch's current one) to read it: on any other stream it would read zeros."""
    torch, _ = torch_modules()
    q = randn((2, 500, 8, 128), torch.bfloat16)
    k, v = (randn((2, 500, 8, 128), torch.bfloat16) for _ in range(2))
    source = randn(q.shape, torch.bfloat16)
    o, lse = forward(q, k, v, causal=True)
    refs = autograd_reference(q, k, v, source, causal=True)
    do = torch.zeros_like(source)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000_000)
        do.copy_(source)
        grads = backward(q, k, v, o, lse, do, causal=True)
    side.synchronize()
    for grad, ref in zip(grads, refs):
        assert relative_error(grad, ref) < gradient_tolerance("bfloat16")


def test_device_mismatch_and_default_config():
    torch, _ = torch_modules()
    q = randn((1, 17, 2, 64), torch.float16)
    lse = torch.zeros((1, 2, 17), device="cuda")
    host = np.zeros((1, 17, 2, 64), np.float16)
    with pytest.raises(flashjit.InvalidArgumentError,
                       match="device mismatch: q is on cuda:0 but do is on cpu"):
        flashjit.attention_backward(q, q, q, q, lse, host)
    with pytest.raises(flashjit.InvalidArgumentError,
                       match="device mismatch: q is on cuda:0 but lse is on cpu"):
        flashjit.attention_backward(q, q, q, q, lse.cpu(), q)
    with pytest.raises(flashjit.InvalidArgumentError, match="but dk is on cpu"):
        flashjit.attention_backward(q, q, q, q, lse, q, dk=torch.empty(q.shape, dtype=q.dtype))
    k, v = (randn((1, 17, 2, 64), torch.float16) for _ in range(2))
    do = randn(q.shape, torch.float16)
    o, lse = forward(q, k, v)
    default = backward(q, k, v, o, lse, do, config="default")
    chosen = flashjit.config_for(q, k, v, pass_="bwd", config="default")
    assert chosen["source"] == "default" and chosen["device"] == "cuda:0"
    given = backward(q, k, v, o, lse, do, config=chosen["config"])
    for a, b, ref in zip(default, given, autograd_reference(q, k, v, do)):
        assert relative_error(a, ref) < gradient_tolerance("float16")
        assert relative_error(b, ref) < gradient_tolerance("float16")
