"""flashjit for PyTorch on CUDA: autograd through flashjit.attention and flashjit.sdpa in
bf16/fp16 against torch.autograd through SDPA's math backend in fp64 (fresh random inputs, odd
seqlens, seqlen_q != seqlen_k both ways, GQA/MQA, causal, both layouts, GPT-style views, expanded
gradients), SDPA's semantics against torch's own SDPA, torch.compile(fullgraph=True) of a module
forward and backward (inductor), the custom operators (opcheck), torch's current stream,
determinism, autocast and the float32 error. Tolerances: the library's gradient_tolerance
(bf16 1e-2, fp16 2e-3 relative L2). Skips without torch + CUDA (fails instead with
FLASHJIT_EXPECT_GPU=1)."""
import os

import pytest

import flashjit
from conftest import (gradient_tolerance, have_module, module_loss_and_grads, require_gpu, seed,
                      tiny_attention_module, torch_reference, torch_relative_error)

if not have_module("torch"):
    if os.environ.get("FLASHJIT_EXPECT_GPU") == "1":
        pytest.fail("FLASHJIT_EXPECT_GPU=1 but torch is not installed", pytrace=False)
    pytest.skip("torch is not installed", allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DTYPES = ["bfloat16", "float16"]


@pytest.fixture(autouse=True)
def gpu():
    require_gpu()


def shape(layout, batch, seqlen, heads, head_dim):
    return (batch, seqlen, heads, head_dim) if layout == "bshd" else (batch, heads, seqlen,
                                                                      head_dim)


def inputs(case, layout, dtype_name, tag=""):
    """q, k, v (CUDA leaves requiring grad) and do for `case`, from a per-case seed."""
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = case
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator(device="cuda").manual_seed(seed("torch-gpu", case, layout,
                                                                dtype_name, tag))

    def randn(*size):
        return torch.randn(size, generator=generator, device="cuda").to(dtype)

    q = randn(*shape(layout, batch, seqlen_q, heads_q, head_dim)).requires_grad_()
    k = randn(*shape(layout, batch, seqlen_k, heads_kv, head_dim)).requires_grad_()
    v = randn(*shape(layout, batch, seqlen_k, heads_kv, head_dim)).requires_grad_()
    return q, k, v, randn(*q.shape)


def check_against_reference(o, grads, q, k, v, do, causal, scale=None, layout="bshd"):
    ref = torch_reference(q, k, v, do, causal=causal, scale=scale, layout=layout)
    tolerance = gradient_tolerance(str(q.dtype).replace("torch.", ""))
    assert torch_relative_error(o, ref[0]) < tolerance, "o"
    for name, grad, expected, like in zip(("dq", "dk", "dv"), grads, ref[1:], (q, k, v)):
        assert grad.shape == like.shape and grad.dtype == like.dtype, name
        assert grad.device == like.device, name
        assert torch_relative_error(grad, expected) < tolerance, name


CASES = [
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
    (1, 1, 1, 1, 1, 64),
    (2, 17, 17, 4, 2, 64),        # GQA
    (1, 1000, 1000, 6, 1, 64),    # MQA
    (1, 77, 513, 2, 2, 128),      # seqlen_q < seqlen_k
    (2, 513, 77, 4, 2, 128),      # seqlen_q > seqlen_k: causal rows without keys
    (2, 256, 256, 6, 6, 64),      # train_gpt's nano attention
]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B%d-q%d-k%d-h%d/%d-d%d" % c)
def test_attention_autograd_matches_math_sdpa_fp64(case, dtype_name, causal, layout):
    q, k, v, do = inputs(case, layout, dtype_name)
    o = flashjit.attention(q, k, v, causal=causal, layout=layout)
    assert o.requires_grad and o.grad_fn is not None and o.is_cuda
    check_against_reference(o, torch.autograd.grad(o, (q, k, v), do), q, k, v, do, causal,
                            layout=layout)


@pytest.mark.parametrize("case", [(2, 128, 128, 8, 8, 64), (1, 100, 300, 8, 2, 128),
                                  (1, 300, 100, 4, 1, 64)],
                         ids=lambda c: "B%d-q%d-k%d-h%d/%d-d%d" % c)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_matches_torch_sdpa(case, causal):
    """flashjit.sdpa has SDPA's semantics (causal top-left with seqlen_q != seqlen_k, GQA):
    against torch's SDPA on the same bf16 inputs, both measured against fp64 math SDPA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, do = inputs(case, "bhsd", "bfloat16", tag="sdpa")
    gqa = q.shape[1] != k.shape[1]
    mine = flashjit.sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)
    grads = torch.autograd.grad(mine, (q, k, v), do)
    with sdpa_kernel([SDPBackend.MATH]):
        qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
        ref = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, enable_gqa=gqa)
    refs = torch.autograd.grad(ref, (qd, kd, vd), do.double())
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    their_grads = torch.autograd.grad(theirs, (q, k, v), do)
    tolerance = gradient_tolerance("bfloat16")
    assert torch_relative_error(mine, ref.detach()) < tolerance
    # Not much worse than torch's own bf16 SDPA on the same inputs.
    assert torch_relative_error(mine, ref.detach()) < 3 * torch_relative_error(
        theirs, ref.detach()) + 2e-3
    for name, grad, expected, their in zip(("dq", "dk", "dv"), grads, refs, their_grads):
        assert torch_relative_error(grad, expected) < tolerance, name
        assert torch_relative_error(grad, expected) < 3 * torch_relative_error(
            their, expected) + 2e-3, name


def test_gpt_views_and_expanded_gradient():
    """q, k, v as transposed views of one projection; loss a plain sum (an expanded gradient,
    copied); o's memory in q's order so o.transpose(1, 2) is contiguous, as with torch SDPA."""
    generator = torch.Generator(device="cuda").manual_seed(seed("gpu-views"))
    batch, seqlen, heads, head_dim = 4, 256, 6, 64
    qkv = torch.randn(batch, seqlen, 3 * heads * head_dim, generator=generator, device="cuda",
                      dtype=torch.bfloat16).requires_grad_()

    def heads_of(qkv):
        return (x.view(batch, seqlen, heads, head_dim).transpose(1, 2)
                for x in qkv.split(heads * head_dim, dim=2))

    o = flashjit.sdpa(*heads_of(qkv), is_causal=True)
    assert o.transpose(1, 2).is_contiguous()
    o.float().sum().backward()
    mine = qkv.grad.clone()
    qkv.grad = None
    reference = qkv.detach().double().requires_grad_()
    F.scaled_dot_product_attention(*heads_of(reference), is_causal=True).sum().backward()
    assert torch_relative_error(mine, reference.grad) < gradient_tolerance("bfloat16")


def test_torch_compile_fullgraph_inductor_forward_and_backward():
    """torch.compile(fullgraph=True) (inductor where triton is, bf16 autocast) of a GQA attention
    module: no graph break; loss and parameter gradients agree with the eager flashjit module and with torch
    SDPA's."""
    import torch._dynamo

    from torch.utils._triton import has_triton

    torch._dynamo.reset()
    torch.manual_seed(seed("gpu-compile-init"))
    model = tiny_attention_module(width=512, heads=8, heads_kv=2).cuda()
    x = torch.randn(4, 200, 512, device="cuda",
                    generator=torch.Generator(device="cuda").manual_seed(seed("gpu-compile")))
    # inductor's GPU code needs triton; without it, aot_eager still traces the whole graph.
    compiled = torch.compile(model, fullgraph=True, backend="inductor" if has_triton() else
                             "aot_eager")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        runs = [module_loss_and_grads(model, compiled, x, flashjit.sdpa) for _ in range(2)]
        eager = module_loss_and_grads(model, model, x, flashjit.sdpa)
        theirs = module_loss_and_grads(model, model, x, F.scaled_dot_product_attention)
    for a, b, c in zip(runs[1], eager, theirs):
        assert torch_relative_error(a, b.double()) < 2e-2
        assert torch_relative_error(a, c.double()) < 2e-2
    assert all(g.abs().sum() > 0 for g in runs[1][1:])
    torch._dynamo.reset()


def test_custom_operators_opcheck():
    q, k, v, do = inputs((2, 70, 90, 4, 2, 64), "bhsd", "bfloat16", tag="opcheck")
    torch.library.opcheck(torch.ops.flashjit.attention.default,
                          (q, k, v, True, None, "bhsd", False, None))
    o, lse = torch.ops.flashjit.attention(q, k, v, True, None, "bhsd", False, None)
    torch.library.opcheck(torch.ops.flashjit.attention_backward.default,
                          (do, q.detach(), k.detach(), v.detach(), o.detach(), lse, True, None,
                           "bhsd", False))


def test_forward_and_backward_run_on_the_current_stream():
    """Inputs written on a busy side stream and the whole forward/backward issued there: right
    results only if flashjit's kernels run on torch's current stream."""
    q, k, v, do = inputs((2, 500, 500, 8, 8, 128), "bshd", "bfloat16", tag="stream")
    ref = torch_reference(q, k, v, do, causal=True)
    sources = [x.detach() for x in (q, k, v, do)]
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000_000)
        q2, k2, v2, do2 = (torch.zeros_like(x) for x in sources)
        for dst, src in zip((q2, k2, v2, do2), sources):
            dst.copy_(src)
        q2, k2, v2 = (x.requires_grad_() for x in (q2, k2, v2))
        o = flashjit.attention(q2, k2, v2, causal=True)
        grads = torch.autograd.grad(o, (q2, k2, v2), do2)
    side.synchronize()
    tolerance = gradient_tolerance("bfloat16")
    assert torch_relative_error(o, ref[0]) < tolerance
    for grad, expected in zip(grads, ref[1:]):
        assert torch_relative_error(grad, expected) < tolerance


def test_deterministic_mode_gives_bitwise_equal_gradients():
    """torch.use_deterministic_algorithms(True) selects the deterministic backward (dQ without
    atomics): two runs give the same bits."""
    q, k, v, do = inputs((2, 1000, 1000, 8, 2, 64), "bshd", "bfloat16", tag="det")
    torch.use_deterministic_algorithms(True)
    try:
        runs = [torch.autograd.grad(flashjit.attention(q, k, v, causal=True), (q, k, v), do)
                for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    check_against_reference(flashjit.attention(q, k, v, causal=True), runs[0], q, k, v, do, True)


def test_float32_raises_a_clear_error_and_autocast_works():
    q = torch.randn(1, 4, 64, 64, device="cuda", requires_grad=True)
    with pytest.raises(flashjit.UnsupportedError, match="bfloat16 or float16.*autocast"):
        flashjit.sdpa(q, q, q)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        o = flashjit.sdpa(q, q, q, is_causal=True)
    assert o.dtype == torch.bfloat16
    (grad,) = torch.autograd.grad(o.float().sum(), (q,))
    assert grad.dtype == torch.float32 and torch.isfinite(grad).all()


def test_no_grad_calls_record_nothing():
    q, k, v, _ = inputs((1, 64, 64, 2, 2, 64), "bshd", "float16", tag="nograd")
    with torch.no_grad():
        o = flashjit.attention(q, k, v)
    assert not o.requires_grad and o.dtype == torch.float16
