"""flashjit.attention on the CPU backend (numpy float16 in, numpy out; jax bfloat16 and torch CPU
tensors where installed) against the fp64 reference: fresh random inputs, odd seqlens, GQA/MQA,
both layouts, causal with seqlen_q != seqlen_k, strided views, poisoned outputs."""
import numpy as np
import pytest

import flashjit
from conftest import (have_module, lse_error, reference_attention, relative_error,
                      require_cpu_backend, seed)

MAX_REL = 1e-2
MAX_LSE = 1e-3


def random(rng, shape, dtype=np.float16):
    return rng.standard_normal(shape).astype(dtype)


def shapes(layout, batch, seqlen, heads, head_dim):
    if layout == "bshd":
        return (batch, seqlen, heads, head_dim)
    return (batch, heads, seqlen, head_dim)


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
def test_numpy_float16_matches_reference(case, causal, layout):
    require_cpu_backend()
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = case
    rng = np.random.default_rng(seed(case, causal, layout))
    q = random(rng, shapes(layout, batch, seqlen_q, heads_q, head_dim))
    k = random(rng, shapes(layout, batch, seqlen_k, heads_kv, head_dim))
    v = random(rng, shapes(layout, batch, seqlen_k, heads_kv, head_dim))
    out, lse = flashjit.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == np.float16 and out.shape == q.shape
    assert isinstance(lse, np.ndarray) and lse.dtype == np.float32
    assert lse.shape == (batch, heads_q, seqlen_q)
    ref, ref_lse = reference_attention(q, k, v, causal=causal, layout=layout)
    assert relative_error(out, ref) < MAX_REL
    assert lse_error(lse, ref_lse) < MAX_LSE


def test_poisoned_out_is_fully_written_and_returned():
    require_cpu_backend()
    rng = np.random.default_rng(1)
    q, k, v = (random(rng, (2, 17, 4, 64)) for _ in range(3))
    out = np.full(q.shape, np.nan, dtype=np.float16)
    lse = np.full((2, 4, 17), np.nan, dtype=np.float32)
    result = flashjit.attention(q, k, v, out=out, lse=lse)
    assert result is out
    ref, ref_lse = reference_attention(q, k, v)
    assert relative_error(out, ref) < MAX_REL
    assert lse_error(lse, ref_lse) < MAX_LSE


def test_strided_views_in_and_out():
    """BSHD views of BHSD arrays (and an output inside a larger buffer): any strides with a
    contiguous last axis, no copies."""
    require_cpu_backend()
    rng = np.random.default_rng(2)
    q_bhsd = random(rng, (2, 4, 17, 64))
    k_bhsd = random(rng, (2, 2, 40, 64))
    v_bhsd = random(rng, (2, 2, 40, 64))
    q, k, v = (np.swapaxes(x, 1, 2) for x in (q_bhsd, k_bhsd, v_bhsd))  # BSHD views
    assert not q.flags.c_contiguous
    backing = np.full((2, 17, 6, 64), np.nan, dtype=np.float16)
    out = backing[:, :, 1:5, :]  # strided output: heads 1..4 of 6
    flashjit.attention(q, k, v, causal=True, out=out)
    ref, _ = reference_attention(q, k, v, causal=True)
    assert relative_error(out, ref) < MAX_REL
    assert np.isnan(backing[:, :, 0]).all() and np.isnan(backing[:, :, 5]).all()


def test_scale_and_default_config():
    require_cpu_backend()
    rng = np.random.default_rng(3)
    q, k, v = (random(rng, (1, 65, 2, 64)) for _ in range(3))
    out = flashjit.attention(q, k, v, scale=0.3, config="default")
    ref, _ = reference_attention(q, k, v, scale=0.3)
    assert relative_error(out, ref) < MAX_REL
    chosen = flashjit.config_for(q, k, v, config="default")
    assert chosen["source"] == "default" and chosen["device"] == "cpu"
    # Without a tuning DB (FLASHJIT_DB=none) the selection is the default too.
    assert flashjit.config_for(q, k, v) == chosen


def test_given_config():
    require_cpu_backend()
    rng = np.random.default_rng(4)
    q, k, v = (random(rng, (1, 100, 2, 64)) for _ in range(3))
    chosen = flashjit.config_for(q, k, v, causal=True, config="m16n32w1s1")
    assert chosen["config"] == "m16n32w1s1" and chosen["source"] == "given"
    out = flashjit.attention(q, k, v, causal=True, config="m16n32w1s1")
    ref, _ = reference_attention(q, k, v, causal=True)
    assert relative_error(out, ref) < MAX_REL


@pytest.mark.skipif(not have_module("jax"), reason="jax is not installed")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_jax_cpu_arrays(dtype):
    require_cpu_backend()
    import jax
    import jax.numpy as jnp

    if jax.default_backend() != "cpu":
        pytest.skip("jax's default backend is not the CPU")
    rng = np.random.default_rng(5)
    host = [rng.standard_normal(shape).astype(np.float32)
            for shape in ((2, 33, 4, 64), (2, 40, 2, 64), (2, 40, 2, 64))]
    q, k, v = (jnp.asarray(x, dtype=dtype) for x in host)
    out, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(out, jax.Array) and out.dtype == q.dtype and out.shape == q.shape
    ref, ref_lse = reference_attention(*(np.asarray(x.astype(jnp.float32)) for x in (q, k, v)),
                                       causal=True)
    assert relative_error(np.asarray(out.astype(jnp.float32)), ref) < MAX_REL
    assert lse_error(np.asarray(lse), ref_lse) < MAX_LSE


@pytest.mark.skipif(not have_module("torch"), reason="torch is not installed")
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_torch_cpu_bfloat16(layout):
    require_cpu_backend()
    import torch

    generator = torch.Generator().manual_seed(6)
    q = torch.randn(shapes(layout, 2, 77, 4, 64), generator=generator).bfloat16()
    k = torch.randn(shapes(layout, 2, 50, 2, 64), generator=generator).bfloat16()
    v = torch.randn(shapes(layout, 2, 50, 2, 64), generator=generator).bfloat16()
    q.requires_grad_(True)
    out = flashjit.attention(q, k, v, causal=True, layout=layout)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == q.shape
    assert out.requires_grad  # differentiable (tests/python/test_torch_autograd.py)
    ref, _ = reference_attention(*(x.detach().float().numpy() for x in (q, k, v)), causal=True,
                                 layout=layout)
    assert relative_error(out.detach().float().numpy(), ref) < MAX_REL


def test_numpy_float32_matches_reference_closely():
    # fp32 storage on the CPU backend: well inside what 16-bit storage could reach, so a kernel
    # that rounded through 16 bits fails.
    require_cpu_backend()
    rng = np.random.default_rng(seed("float32"))
    q = random(rng, (2, 77, 4, 64), np.float32)
    k = random(rng, (2, 50, 2, 64), np.float32)
    v = random(rng, (2, 50, 2, 64), np.float32)
    out, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
    assert out.dtype == np.float32 and out.shape == q.shape
    ref, ref_lse = reference_attention(q, k, v, causal=True)
    assert relative_error(out, ref) < 1e-4
    assert lse_error(lse, ref_lse) < 1e-4
