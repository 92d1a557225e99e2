"""Attention variants on torch tensors: the eager fast path, flashjit.sdpa, the custom operator
under torch.compile(fullgraph=True), on the CPU backend (here) and on CUDA (skips without a GPU,
fails then with FLASHJIT_EXPECT_GPU=1), each against the fp64 reference of the variant
(conftest.reference_variant_attention). Their gradients: test_variants_backward_torch.py."""
import numpy as np
import pytest

import flashjit
from conftest import (have_module, lse_error, reference_variant_attention, relative_error,
                      require_cpu_backend, require_gpu, seed)

if not have_module("torch"):
    pytest.skip("torch is not installed", allow_module_level=True)

import torch  # noqa: E402

MAX_REL = 1e-2
MAX_LSE = 2e-3


def slopes(heads, device="cpu"):
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)],
                        dtype=torch.float32, device=device)


def randn(*shape, dtype=torch.float32, device="cpu", generator=None):
    return torch.randn(*shape, generator=generator).to(dtype=dtype, device=device)


def numpy(x):
    return x.detach().float().cpu().numpy()


# (id, variant kwargs for flashjit, the reference's (expressions as numpy functions), causal)
VARIANTS = [
    ("window", dict(window=(7, 2)), dict(window=(7, 2)), False),
    ("window-causal", dict(window=(20, 0)), dict(window=(20, 0)), True),
    ("softcap-causal", dict(softcap=3.0), dict(softcap=3.0), True),
    ("alibi-causal", dict(alibi=True), dict(alibi=True), True),
    ("prefix-window-causal", dict(prefix=9, window=(5, 0)), dict(prefix=9, window=(5, 0)), True),
    ("score-mod", dict(score_mod="score - 0.05f * abs(q_idx - kv_idx)"),
     dict(score_mod=lambda s, b, h, i, j: s - 0.05 * np.abs(i - j)), False),
    ("documents-causal", dict(mask_mod="(q_idx / 16) == (kv_idx / 16)"),
     dict(mask_mod=lambda b, h, i, j: (i // 16) == (j // 16)), True),
    ("window-softcap-alibi-gqa", dict(window=(15, 0), softcap=4.0, alibi=True),
     dict(window=(15, 0), softcap=4.0, alibi=True), True),
]


def run_case(device, dtype, variant, layout, batch=2, seqlen_q=67, seqlen_k=67, heads_q=4,
             heads_kv=2, head_dim=64, scale=None, through_sdpa=False):
    name, mine, theirs, causal = variant
    generator = torch.Generator().manual_seed(seed("torch-variant", name, str(dtype), layout))

    def shape(seqlen, heads):
        if layout == "bshd":
            return (batch, seqlen, heads, head_dim)
        return (batch, heads, seqlen, head_dim)

    q = randn(*shape(seqlen_q, heads_q), dtype=dtype, device=device, generator=generator)
    k = randn(*shape(seqlen_k, heads_kv), dtype=dtype, device=device, generator=generator)
    v = randn(*shape(seqlen_k, heads_kv), dtype=dtype, device=device, generator=generator)
    mine, theirs = dict(mine), dict(theirs)
    if mine.pop("alibi", False):
        mine["alibi_slopes"] = slopes(heads_q, device)
        theirs.pop("alibi")
        theirs["alibi_slopes"] = numpy(mine["alibi_slopes"])
    if through_sdpa:
        out = flashjit.sdpa(q, k, v, is_causal=causal, scale=scale, enable_gqa=True, **mine)
        lse = None
    else:
        out, lse = flashjit.attention(q, k, v, causal=causal, scale=scale, layout=layout,
                                      return_lse=True, **mine)
    assert out.dtype == q.dtype and out.shape == q.shape and out.device == q.device
    ref, ref_lse = reference_variant_attention(numpy(q), numpy(k), numpy(v), causal=causal,
                                               scale=scale, layout=layout, **theirs)
    assert relative_error(numpy(out), ref) < MAX_REL, name
    if lse is not None:
        assert lse_error(numpy(lse), ref_lse) < MAX_LSE, name
    plain, _ = reference_variant_attention(numpy(q), numpy(k), numpy(v), causal=causal,
                                           scale=scale, layout=layout)
    assert relative_error(plain, ref) > 5 * MAX_REL, f"{name}: the variant changes nothing here"


# ---- CPU backend -------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_cpu_eager_matches_reference(variant):
    require_cpu_backend()
    with torch.no_grad():
        run_case("cpu", torch.float32, variant, "bshd", seqlen_q=67, seqlen_k=90)


@pytest.mark.parametrize("variant", VARIANTS[:4], ids=[v[0] for v in VARIANTS[:4]])
def test_cpu_sdpa_matches_reference(variant):
    require_cpu_backend()
    run_case("cpu", torch.bfloat16, variant, "bhsd", through_sdpa=True)


def test_variant_calls_are_differentiable():
    require_cpu_backend()
    q = torch.randn(1, 9, 2, 64, requires_grad=True)
    k, v = torch.randn(1, 9, 2, 64), torch.randn(1, 9, 2, 64)
    assert flashjit.attention(q, k, v, causal=True, window=(4, 0), softcap=30.0).requires_grad
    assert flashjit.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                         alibi_slopes=torch.ones(2)).requires_grad
    # Slopes that require grad would get no gradient: refused.
    with pytest.raises(flashjit.UnsupportedError, match="alibi_slopes requires grad"):
        flashjit.attention(q.detach(), k, v, alibi_slopes=torch.ones(2, requires_grad=True))
    with torch.no_grad():
        assert not flashjit.attention(q, k, v, causal=True, window=(4, 0)).requires_grad
    assert not flashjit.attention(q.detach(), k, v, window=(4, 0)).requires_grad


def test_operator_backward_is_the_variants():
    """A direct caller of flashjit::attention with a variant and autograd gets the variant's
    gradient (the eager path's), not plain attention's."""
    require_cpu_backend()
    from flashjit import _torch

    q = torch.randn(1, 9, 2, 64, requires_grad=True)
    k, v = torch.randn(1, 9, 2, 64), torch.randn(1, 9, 2, 64)
    o, _ = _torch.attention_op(q, k, v, True, None, "bshd", False, None, 3, 0, None, 0, "", "",
                               "", None)
    (dq,) = torch.autograd.grad(o.sum(), (q,))
    (eager,) = torch.autograd.grad(flashjit.attention(q, k, v, causal=True, window=(3, 0)).sum(),
                                   (q,))
    (plain,) = torch.autograd.grad(flashjit.attention(q, k, v, causal=True).sum(), (q,))
    assert torch.equal(dq, eager) and not torch.allclose(dq, plain)


def test_plan_cache_keys_on_the_variant_and_the_slopes():
    require_cpu_backend()
    generator = torch.Generator().manual_seed(seed("plans"))
    q, k, v = (torch.randn(1, 33, 2, 64, generator=generator) for _ in range(3))
    a = flashjit.attention(q, k, v, window=(3, 3))
    b = flashjit.attention(q, k, v, window=(5, 5))
    c = flashjit.attention(q, k, v, score_mod="score * 2.0f")
    d = flashjit.attention(q, k, v, score_mod="score * 0.5f")
    assert not torch.equal(a, b) and not torch.equal(c, d)
    e = flashjit.attention(q, k, v, alibi_slopes=torch.tensor([0.5, 0.25]))
    f = flashjit.attention(q, k, v, alibi_slopes=torch.tensor([0.0, 0.0]))
    assert torch.equal(f, flashjit.attention(q, k, v, score_mod="score"))
    assert not torch.equal(e, f)
    with pytest.raises(flashjit.InvalidArgumentError, match=r"alibi_slopes.shape = \(3,\)"):
        flashjit.attention(q, k, v, alibi_slopes=torch.zeros(3))


def test_sdpa_refuses_top_left_causal_with_a_variant():
    q = torch.randn(1, 2, 9, 64)
    k = v = torch.randn(1, 2, 12, 64)
    with pytest.raises(flashjit.UnsupportedError, match="top-left"):
        flashjit.sdpa(q, k, v, is_causal=True, window=(3, 0))


def test_torch_compile_fullgraph_runs_the_variant_operator():
    require_cpu_backend()
    import torch._dynamo

    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(seed("compile-variant"))
    q, k, v = (torch.randn(1, 2, 40, 64, generator=generator) for _ in range(3))
    heads_slopes = slopes(2)

    def f(q, k, v, s):
        return flashjit.sdpa(q, k, v, is_causal=True, window=(8, 0), softcap=20.0,
                             alibi_slopes=s, mask_mod="kv_idx % 7 != 3")

    with torch.no_grad():
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(q, k, v, heads_slopes), f(q, k, v, heads_slopes))
    ref, _ = reference_variant_attention(
        q.numpy(), k.numpy(), v.numpy(), causal=True, layout="bhsd", window=(8, 0), softcap=20.0,
        alibi_slopes=heads_slopes.numpy(), mask_mod=lambda b, h, i, j: j % 7 != 3)
    assert relative_error(f(q, k, v, heads_slopes).numpy(), ref) < MAX_REL
    # With autograd: test_variants_backward_torch.py.


# ---- CUDA ------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_cuda_matches_reference(variant, layout):
    require_gpu()
    run_case("cuda", torch.bfloat16, variant, layout, seqlen_q=300, seqlen_k=257, head_dim=128)


def test_cuda_sdpa_and_compile():
    require_gpu()
    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 4, 1000, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))

    def f(q, k, v):
        return flashjit.sdpa(q, k, v, is_causal=True, window=(100, 0), softcap=50.0)

    with torch.no_grad():
        assert torch.equal(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v))


def test_cuda_slopes_on_another_device_are_refused():
    require_gpu()
    q = k = v = torch.zeros(1, 9, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(flashjit.InvalidArgumentError, match="alibi_slopes is on cpu"):
        flashjit.attention(q, k, v, alibi_slopes=torch.ones(2))
