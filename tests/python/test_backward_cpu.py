"""flashjit.attention_backward on the CPU backend (numpy in, numpy out) against fp64 numpy
gradients: fresh random inputs, odd seqlens, GQA/MQA, both layouts, causal with seqlen_q !=
seqlen_k both ways, strided views, poisoned outputs, float32, determinism. o and lse come from
flashjit's forward, as a training step has them. The reference itself is checked against
central differences first (that test runs on every build)."""
import numpy as np
import pytest

import flashjit
from conftest import (gradient_tolerance, have_module, reference_attention, reference_gradients,
                      relative_error, require_cpu_backward, seed)


def random(rng, shape, dtype=np.float16):
    return rng.standard_normal(shape).astype(dtype)


def shapes(layout, batch, seqlen, heads, head_dim):
    if layout == "bshd":
        return (batch, seqlen, heads, head_dim)
    return (batch, heads, seqlen, head_dim)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_reference_gradients_match_central_differences(causal):
    """The fp64 gradients are those of L = sum(do * attention(q, k, v)): GQA (4 query heads on 2
    key/value heads) and, causal, seqlen_q > seqlen_k (rows without keys)."""
    rng = np.random.default_rng(seed("central differences", causal))
    q = rng.standard_normal((1, 5, 4, 8))
    k = rng.standard_normal((1, 3, 2, 8))
    v = rng.standard_normal((1, 3, 2, 8))
    do = rng.standard_normal((1, 5, 4, 8))
    grads = reference_gradients(q, k, v, do, causal=causal, scale=0.4)

    def loss(q_, k_, v_):
        return float((reference_attention(q_, k_, v_, causal=causal, scale=0.4)[0] * do).sum())

    step = 1e-6
    for index, (tensor, grad) in enumerate(zip((q, k, v), grads)):
        numeric = np.zeros_like(tensor)
        for position in np.ndindex(tensor.shape):
            args = [q.copy(), k.copy(), v.copy()]
            args[index][position] += step
            plus = loss(*args)
            args[index][position] -= 2 * step
            numeric[position] = (plus - loss(*args)) / (2 * step)
        assert np.abs(numeric - grad).max() < 1e-6, ("q", "k", "v")[index]
        assert np.abs(grad).max() > 1e-2  # not trivially zero
    if causal:  # query rows 0 and 1 see no key (seqlen_q 5 > seqlen_k 3)
        assert not grads[0][:, :2].any()


CASES = [
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
    (1, 1, 1, 2, 2, 64),
    (2, 17, 17, 4, 2, 64),      # GQA
    (1, 1000, 1000, 2, 1, 64),  # MQA
    (1, 17, 300, 4, 4, 64),     # seqlen_q < seqlen_k
    (2, 300, 17, 2, 2, 64),     # seqlen_q > seqlen_k: causal rows without keys
    (1, 33, 65, 2, 2, 128),
]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B%d-q%d-k%d-h%d/%d-d%d" % c)
def test_numpy_float16_gradients_match_reference(case, causal, layout):
    require_cpu_backward()
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = case
    rng = np.random.default_rng(seed("backward", case, causal, layout))
    q = random(rng, shapes(layout, batch, seqlen_q, heads_q, head_dim))
    k = random(rng, shapes(layout, batch, seqlen_k, heads_kv, head_dim))
    v = random(rng, shapes(layout, batch, seqlen_k, heads_kv, head_dim))
    do = random(rng, q.shape)
    o, lse = flashjit.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    dq, dk, dv = flashjit.attention_backward(q, k, v, o, lse, do, causal=causal, layout=layout)
    for name, grad, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        assert isinstance(grad, np.ndarray) and grad.dtype == np.float16, name
        assert grad.shape == like.shape, name
        assert grad.flags.c_contiguous, name
    refs = reference_gradients(q, k, v, do, causal=causal, layout=layout)
    tolerance = gradient_tolerance("float16")
    for name, grad, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), refs):
        assert relative_error(grad, ref) < tolerance, name


def test_poisoned_outputs_are_fully_written_and_returned():
    require_cpu_backward()
    rng = np.random.default_rng(1)
    q = random(rng, (2, 77, 4, 64))
    k, v = (random(rng, (2, 50, 2, 64)) for _ in range(2))
    do = random(rng, q.shape)
    o, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
    given = [np.full(x.shape, np.nan, np.float16) for x in (q, k, v)]
    result = flashjit.attention_backward(q, k, v, o, lse, do, causal=True, dq=given[0],
                                         dk=given[1], dv=given[2])
    assert all(r is g for r, g in zip(result, given))
    refs = reference_gradients(q, k, v, do, causal=True)
    for grad, ref in zip(given, refs):
        assert relative_error(grad, ref) < gradient_tolerance("float16")


def test_strided_views_in_and_out():
    """BSHD views of BHSD arrays for every input, gradients into the middle heads of wider
    buffers: any strides with a contiguous last axis, nothing written outside."""
    require_cpu_backward()
    rng = np.random.default_rng(2)
    q, do = (np.swapaxes(random(rng, (2, 4, 17, 64)), 1, 2) for _ in range(2))
    k, v = (np.swapaxes(random(rng, (2, 2, 40, 64)), 1, 2) for _ in range(2))
    assert not q.flags.c_contiguous
    o_backing = np.full((2, 17, 5, 64), np.nan, np.float16)
    o = o_backing[:, :, 1:, :]
    lse = np.empty((2, 4, 17), np.float32)
    flashjit.attention(q, k, v, causal=True, out=o, lse=lse)
    backing = [np.full((2, n, 6, 64), np.nan, np.float16) for n in (17, 40, 40)]
    dq, dk, dv = (b[:, :, 1:1 + heads, :] for b, heads in zip(backing, (4, 2, 2)))
    flashjit.attention_backward(q, k, v, o, lse, do, causal=True, dq=dq, dk=dk, dv=dv)
    refs = reference_gradients(q, k, v, do, causal=True)
    for grad, ref in zip((dq, dk, dv), refs):
        assert relative_error(grad, ref) < gradient_tolerance("float16")
    assert np.isnan(backing[0][:, :, 0]).all() and np.isnan(backing[0][:, :, 5]).all()
    for b in backing[1:]:
        assert np.isnan(b[:, :, 0]).all() and np.isnan(b[:, :, 3:]).all()


def test_float32_deterministic_scale_and_configs():
    """fp32 storage: gradients within what 16-bit storage could not reach; deterministic=True
    gives bitwise equal gradients call after call; config="default" and config_for agree."""
    require_cpu_backward()
    rng = np.random.default_rng(seed("float32 backward"))
    q = random(rng, (2, 77, 4, 64), np.float32)
    k, v = (random(rng, (2, 50, 2, 64), np.float32) for _ in range(2))
    do = random(rng, q.shape, np.float32)
    o, lse = flashjit.attention(q, k, v, causal=True, scale=0.3, return_lse=True)
    first = flashjit.attention_backward(q, k, v, o, lse, do, causal=True, scale=0.3,
                                        deterministic=True)
    refs = reference_gradients(q, k, v, do, causal=True, scale=0.3)
    for grad, ref in zip(first, refs):
        assert grad.dtype == np.float32
        assert relative_error(grad, ref) < gradient_tolerance("float32")
    again = flashjit.attention_backward(q, k, v, o, lse, do, causal=True, scale=0.3,
                                        deterministic=True)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))

    chosen = flashjit.config_for(q, k, v, causal=True, pass_="bwd", config="default")
    assert chosen["source"] == "default" and chosen["device"] == "cpu"
    assert chosen["problem"].startswith("attention_backward(")
    assert flashjit.config_for(q, k, v, causal=True, pass_="bwd") == chosen  # no DB: the default
    given = flashjit.attention_backward(q, k, v, o, lse, do, causal=True, scale=0.3,
                                        config=chosen["config"])
    for grad, ref in zip(given, refs):
        assert relative_error(grad, ref) < gradient_tolerance("float32")


@pytest.mark.skipif(not have_module("torch"), reason="torch is not installed")
def test_torch_cpu_bfloat16_requiring_grad():
    require_cpu_backward()
    import torch

    generator = torch.Generator().manual_seed(6)
    q = torch.randn(2, 77, 4, 64, generator=generator).bfloat16().requires_grad_()
    k = torch.randn(2, 50, 2, 64, generator=generator).bfloat16().requires_grad_()
    v = torch.randn(2, 50, 2, 64, generator=generator).bfloat16().requires_grad_()
    do = torch.randn(2, 77, 4, 64, generator=generator).bfloat16()
    o, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = flashjit.attention_backward(q, k, v, o, lse, do, causal=True)
    assert all(isinstance(g, torch.Tensor) and g.dtype == torch.bfloat16 for g in (dq, dk, dv))
    assert dk.shape == k.shape and not dq.requires_grad
    refs = reference_gradients(*(x.detach().float().numpy() for x in (q, k, v, do)), causal=True)
    for grad, ref in zip((dq, dk, dv), refs):
        assert relative_error(grad.float().numpy(), ref) < gradient_tolerance("bfloat16")
