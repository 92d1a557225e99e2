"""flashjit for PyTorch on the CPU backend: autograd through flashjit.attention and flashjit.sdpa
against torch.autograd through SDPA's math backend in fp64 (fresh random inputs, odd seqlens,
seqlen_q != seqlen_k both ways, GQA/MQA, causal, both layouts, strided views, expanded
gradients), torch.autograd.gradcheck on float32, the custom operators (torch.library.opcheck),
torch.compile(fullgraph=True) of a module forward and backward, poisoned outputs, autocast,
SDPA's semantics and errors, and the fast path's plan cache.
Skips without torch or without the CPU backend."""
import pytest

import flashjit
from conftest import (gradient_tolerance, have_module, module_loss_and_grads,
                      require_cpu_backward, seed, tiny_attention_module, torch_reference,
                      torch_relative_error)

if not have_module("torch"):
    pytest.skip("torch is not installed", allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# Relative L2 error of a float32 forward against fp64 (the CPU kernels accumulate in fp32).
FORWARD_F32 = 1e-5


@pytest.fixture(autouse=True)
def cpu_backward():
    require_cpu_backward()


def shape(layout, batch, seqlen, heads, head_dim):
    return (batch, seqlen, heads, head_dim) if layout == "bshd" else (batch, heads, seqlen,
                                                                      head_dim)


def inputs(case, layout, dtype=torch.float32, tag=""):
    """q, k, v (leaves requiring grad) and do for `case`, from a per-case seed."""
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = case
    generator = torch.Generator().manual_seed(seed("torch", case, layout, str(dtype), tag))

    def randn(*size):
        return torch.randn(size, generator=generator).to(dtype)

    q = randn(*shape(layout, batch, seqlen_q, heads_q, head_dim)).requires_grad_()
    k = randn(*shape(layout, batch, seqlen_k, heads_kv, head_dim)).requires_grad_()
    v = randn(*shape(layout, batch, seqlen_k, heads_kv, head_dim)).requires_grad_()
    do = randn(*q.shape)
    return q, k, v, do


def check_against_reference(o, grads, q, k, v, do, causal, scale=None, layout="bshd",
                            tolerance=None):
    ref = torch_reference(q, k, v, do, causal=causal, scale=scale, layout=layout)
    tolerance = tolerance or gradient_tolerance(str(q.dtype).replace("torch.", ""))
    assert torch_relative_error(o, ref[0]) < max(FORWARD_F32, tolerance / 4), "o"
    for name, grad, expected, like in zip(("dq", "dk", "dv"), grads, ref[1:], (q, k, v)):
        assert grad.shape == like.shape and grad.dtype == like.dtype, name
        assert torch_relative_error(grad, expected) < tolerance, name


CASES = [
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
    (1, 1, 1, 1, 1, 64),
    (2, 17, 17, 4, 2, 64),      # GQA
    (1, 300, 300, 3, 1, 64),    # MQA
    (1, 17, 130, 2, 2, 64),     # seqlen_q < seqlen_k
    (2, 130, 17, 2, 2, 64),     # seqlen_q > seqlen_k: causal rows without keys
    (1, 33, 65, 2, 2, 128),
]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B%d-q%d-k%d-h%d/%d-d%d" % c)
def test_attention_autograd_float32_matches_math_sdpa_fp64(case, causal, layout):
    q, k, v, do = inputs(case, layout)
    o = flashjit.attention(q, k, v, causal=causal, layout=layout)
    assert o.requires_grad and o.grad_fn is not None
    grads = torch.autograd.grad(o, (q, k, v), do)
    check_against_reference(o, grads, q, k, v, do, causal, layout=layout)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_attention_autograd_16_bit(dtype):
    case = (2, 77, 50, 4, 2, 64)
    q, k, v, do = inputs(case, "bshd", dtype)
    o = flashjit.attention(q, k, v, causal=True)
    assert o.dtype == dtype
    check_against_reference(o, torch.autograd.grad(o, (q, k, v), do), q, k, v, do, True)


def test_gradcheck_float32():
    """torch.autograd.gradcheck (central differences against the backward) on float32: the
    tolerances fit float32's rounding at eps = 1e-3, and a wrong gradient (a missing term, a
    wrong scale, the GQA sum dropped) is off by far more."""
    generator = torch.Generator().manual_seed(seed("gradcheck"))
    q = torch.randn(1, 5, 4, 16, generator=generator).requires_grad_()
    k = torch.randn(1, 7, 2, 16, generator=generator).requires_grad_()
    v = torch.randn(1, 7, 2, 16, generator=generator).requires_grad_()

    def run(q, k, v):
        return flashjit.attention(q, k, v, causal=True, scale=0.3)

    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(run, (q, k, v), eps=1e-3, atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("case", [(2, 40, 40, 4, 4, 64), (1, 33, 70, 6, 2, 64),
                                  (1, 70, 33, 2, 1, 64)],
                         ids=lambda c: "B%d-q%d-k%d-h%d/%d-d%d" % c)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_matches_torch_sdpa(case, causal):
    """flashjit.sdpa has SDPA's semantics, causal seqlen_q != seqlen_k (top-left) included:
    output and gradients against float32 SDPA (math backend) within float32 rounding."""
    q, k, v, do = inputs(case, "bhsd", tag="sdpa")
    gqa = q.shape[1] != k.shape[1]
    mine = flashjit.sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)
    grads = torch.autograd.grad(mine, (q, k, v), do)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
        ref = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, enable_gqa=gqa)
    refs = torch.autograd.grad(ref, (qd, kd, vd), do.double())
    assert torch_relative_error(mine, ref.detach()) < FORWARD_F32
    for name, grad, expected in zip(("dq", "dk", "dv"), grads, refs):
        assert torch_relative_error(grad, expected) < gradient_tolerance("float32"), name


def test_model_like_views_and_expanded_gradients():
    """nanoGPT's tensors: q, k, v as transposed views of one projection (strides with gaps, a
    bshd memory order in the bhsd layout); the loss a plain sum (autograd passes an expanded
    gradient with zero strides, which the kernels cannot read: copied); the output's memory in
    q's order, so o.transpose(1, 2) is contiguous as with torch SDPA."""
    generator = torch.Generator().manual_seed(seed("views"))
    batch, seqlen, heads, head_dim = 2, 45, 3, 64
    qkv = torch.randn(batch, seqlen, 3 * heads * head_dim, generator=generator).requires_grad_()
    q, k, v = (x.view(batch, seqlen, heads, head_dim).transpose(1, 2)
               for x in qkv.split(heads * head_dim, dim=2))
    o = flashjit.sdpa(q, k, v, is_causal=True)
    assert o.transpose(1, 2).is_contiguous()
    o.sum().backward()
    mine = qkv.grad.clone()
    qkv.grad = None
    q, k, v = (x.view(batch, seqlen, heads, head_dim).transpose(1, 2)
               for x in qkv.split(heads * head_dim, dim=2))
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    assert torch_relative_error(mine, qkv.grad.double()) < gradient_tolerance("float32")


def test_outputs_are_fully_written(monkeypatch):
    """Every output the fast path allocates is poisoned with NaN first: any element a kernel
    left unwritten shows up (o, dq, dk, dv in both memory orders; lse)."""
    from flashjit import _torch

    allocate = _torch._new_like
    allocate_lse = _torch._new_lse
    monkeypatch.setattr(_torch, "_new_like", lambda x: allocate(x).fill_(float("nan")))
    monkeypatch.setattr(_torch, "_new_lse", lambda q, s: allocate_lse(q, s).fill_(float("nan")))
    _torch.clear_plans()
    for layout, causal in (("bshd", True), ("bhsd", False)):
        q, k, v, do = inputs((2, 37, 50, 4, 2, 64), layout, tag="poison")
        o, lse = flashjit.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
        grads = torch.autograd.grad(o, (q, k, v), do)
        assert torch.isfinite(lse).all()
        check_against_reference(o, grads, q, k, v, do, causal, layout=layout)
    _torch.clear_plans()


def test_custom_operators_opcheck():
    """torch.library.opcheck: schema, fake (meta) implementation, autograd registration and
    AOT dispatch of flashjit::attention and flashjit::attention_backward."""
    q, k, v, do = inputs((1, 20, 24, 4, 2, 64), "bhsd", tag="opcheck")
    torch.library.opcheck(torch.ops.flashjit.attention.default,
                          (q, k, v, True, None, "bhsd", False, None))
    o, lse = torch.ops.flashjit.attention(q, k, v, True, None, "bhsd", False, None)
    torch.library.opcheck(torch.ops.flashjit.attention_backward.default,
                          (do, q.detach(), k.detach(), v.detach(), o.detach(), lse, True, None,
                           "bhsd", False))


def padded(x, pad, offset=0):
    """x's values in a view the kernels cannot read in place: the last axis padded by `pad`
    elements (other strides not multiples of 8 when pad is odd), starting `offset` elements into
    its storage (misaligned when offset * itemsize is not a multiple of 16)."""
    shape = x.shape[:-1] + (x.shape[-1] + pad,)
    storage = torch.zeros(offset + shape.numel(), dtype=x.dtype)
    view = storage[offset:].view(shape)[..., :x.shape[-1]]
    with torch.no_grad():
        view.copy_(x)
    return view.requires_grad_(x.requires_grad)


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
def test_unreadable_inputs_are_copied_with_outputs_as_the_fake_says(offset):
    """Inputs with strides the kernels cannot read (copied first), misaligned or not: opcheck
    (the fake implementation's strides match the real outputs'), and the eager gradients right
    (the backward reads the tensors the forward launched with)."""
    q, k, v, do = inputs((1, 19, 23, 4, 2, 64), "bhsd", tag="padded")
    pq, pk, pv = (padded(x.detach(), 3, offset).requires_grad_() for x in (q, k, v))
    assert pq.stride(2) % 8 != 0
    torch.library.opcheck(torch.ops.flashjit.attention.default,
                          (pq, pk, pv, True, None, "bhsd", False, None))
    for _ in range(2):  # the first call prepares the plan, the second reuses it
        o = flashjit.attention(pq, pk, pv, causal=True, layout="bhsd")
        assert o.stride() == torch.empty_like(q).stride()
        grads = torch.autograd.grad(o, (pq, pk, pv), padded(do, 5, offset))
        check_against_reference(o, grads, q, k, v, do, True, layout="bhsd")


def test_custom_operator_and_eager_paths_agree_bitwise():
    """The operator (what torch.compile calls) and the eager autograd.Function run the same
    kernels: identical outputs and gradients; lse is not differentiable on either."""
    q, k, v, do = inputs((1, 50, 50, 2, 1, 64), "bshd", tag="paths")
    eager, eager_lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
    op, op_lse = torch.ops.flashjit.attention(q, k, v, True, None, "bshd", False, None)
    assert not eager_lse.requires_grad and not op_lse.requires_grad
    assert torch.equal(eager, op) and torch.equal(eager_lse, op_lse)
    for a, b in zip(torch.autograd.grad(eager, (q, k, v), do),
                    torch.autograd.grad(op, (q, k, v), do)):
        assert torch.equal(a, b)


def test_no_grad_and_detached_calls_record_nothing():
    q, k, v, _ = inputs((1, 9, 9, 1, 1, 64), "bshd", tag="nograd")
    with torch.no_grad():
        assert not flashjit.attention(q, k, v).requires_grad
    assert not flashjit.attention(q.detach(), k.detach(), v.detach()).requires_grad
    only_v = flashjit.attention(q.detach(), k.detach(), v)
    (grad_v,) = torch.autograd.grad(only_v.sum(), (v,))
    assert torch.isfinite(grad_v).all() and grad_v.abs().sum() > 0


def test_autocast_casts_float32_inputs_as_sdpa_does():
    q, k, v, do = inputs((1, 30, 30, 2, 2, 64), "bhsd", tag="autocast")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mine = flashjit.sdpa(q, k, v, is_causal=True)
        theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert mine.dtype == theirs.dtype == torch.bfloat16
    grads = torch.autograd.grad(mine, (q, k, v), do.bfloat16())
    assert all(g.dtype == torch.float32 for g in grads)  # the leaves' dtype, as SDPA's
    ref = torch_reference(q, k, v, do, causal=True, layout="bhsd")
    assert torch_relative_error(mine, ref[0]) < gradient_tolerance("bfloat16")
    for grad, expected in zip(grads, ref[1:]):
        assert torch_relative_error(grad, expected) < 2 * gradient_tolerance("bfloat16")


def test_plan_cache_keys_on_shapes_strides_and_options():
    """One prepared call per (shapes, strides, dtypes, devices, options): a second identical call
    adds none; another stride pattern, dtype or option does; results stay right throughout, also
    for a misaligned view (copied before the launch)."""
    from flashjit import _torch

    _torch.clear_plans()
    q, k, v, do = inputs((1, 24, 24, 2, 2, 64), "bshd", tag="plans")
    with torch.no_grad():
        first = flashjit.attention(q, k, v)
        assert len(_torch._PLANS) == 1
        assert torch.equal(first, flashjit.attention(q, k, v))
        assert len(_torch._PLANS) == 1
        flashjit.attention(q, k, v, causal=True)
        flashjit.attention(q.transpose(1, 2).contiguous().transpose(1, 2), k, v)
        flashjit.attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
        assert len(_torch._PLANS) == 4
        # A view starting 4 bytes into its storage: not 16-byte aligned, copied first.
        storage = torch.randn(q.numel() + 1)
        shifted = storage[1:].view(q.shape)
        shifted.copy_(q)
        assert shifted.data_ptr() % 16 != 0
        assert torch.equal(flashjit.attention(shifted, k, v), first)
    _torch.clear_plans()


def test_sdpa_errors_say_what_is_unsupported():
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(flashjit.UnsupportedError, match="attn_mask"):
        flashjit.sdpa(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(flashjit.UnsupportedError, match="dropout_p = 0.1"):
        flashjit.sdpa(q, q, q, dropout_p=0.1)
    kv = torch.randn(1, 1, 8, 64)
    with pytest.raises(flashjit.InvalidArgumentError, match="enable_gqa=True"):
        flashjit.sdpa(q, kv, kv)
    with pytest.raises(flashjit.InvalidArgumentError, match="must be 4-D"):
        flashjit.sdpa(q[0], q[0], q[0])
    with pytest.raises(TypeError, match="torch.Tensor"):
        flashjit.sdpa(q.numpy(), q, q)
    assert flashjit.sdpa(q, q, q, dropout_p=0.0).shape == q.shape


def test_autograd_refuses_out_lse_and_stream():
    q = torch.randn(1, 8, 2, 64, requires_grad=True)
    with pytest.raises(flashjit.InvalidArgumentError, match="do not support autograd"):
        flashjit.attention(q, q, q, out=torch.empty(q.shape))
    with torch.no_grad():  # fine without autograd
        out = torch.empty(q.shape)
        assert flashjit.attention(q, q, q, out=out) is out
    with pytest.raises(flashjit.InvalidArgumentError, match="deterministic"):
        flashjit.attention(q.detach().numpy(), q.detach().numpy(), q.detach().numpy(),
                           deterministic=True)


def test_bad_shapes_raise_the_library_errors():
    q = torch.randn(1, 8, 2, 60, requires_grad=True)  # head_dim not a multiple of 8
    with pytest.raises(flashjit.InvalidArgumentError, match="head_dim = 60"):
        flashjit.attention(q, q, q)
    k = torch.randn(1, 8, 3, 64)
    with pytest.raises(flashjit.InvalidArgumentError, match="heads_kv = 3"):
        flashjit.attention(torch.randn(1, 8, 4, 64), k, k)


def test_scale_and_deterministic_reach_the_backward():
    """scale changes the gradients as the reference says; torch's deterministic mode is the
    default of deterministic= (the CPU backward is deterministic anyway: same bits)."""
    q, k, v, do = inputs((1, 21, 21, 2, 2, 64), "bshd", tag="scale")
    o = flashjit.attention(q, k, v, causal=True, scale=0.7)
    grads = torch.autograd.grad(o, (q, k, v), do)
    check_against_reference(o, grads, q, k, v, do, True, scale=0.7)
    torch.use_deterministic_algorithms(True)
    try:
        o2 = flashjit.attention(q, k, v, causal=True, scale=0.7)
        again = torch.autograd.grad(o2, (q, k, v), do)
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(grads, again))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_forward_and_backward(backend):
    """torch.compile(fullgraph=True) traces flashjit.sdpa without a graph break (fullgraph raises
    on one) and calls flashjit's kernels: the compiled module's loss and parameter gradients equal
    the eager module's bitwise (aot_eager: the same operators) or to float32 rounding (inductor
    fuses the projections), and agree with torch SDPA's."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(seed("compile-init", backend))
    model = tiny_attention_module()
    x = torch.randn(2, 37, 64, generator=torch.Generator().manual_seed(seed("compile", backend)))
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    mine = module_loss_and_grads(model, compiled, x, flashjit.sdpa)
    eager = module_loss_and_grads(model, model, x, flashjit.sdpa)
    theirs = module_loss_and_grads(model, model, x, F.scaled_dot_product_attention)
    for a, b, c in zip(mine, eager, theirs):
        if backend == "aot_eager":
            assert torch.equal(a, b)
        else:
            assert torch_relative_error(a, b.double()) < 1e-5
        assert torch_relative_error(a, c.double()) < gradient_tolerance("float32")
    assert all(g.abs().sum() > 0 for g in mine[1:])
    torch._dynamo.reset()


def test_torch_compile_sees_the_custom_operator():
    """The compiled graph holds flashjit::attention (and its backward), not a trace of the
    extension's Python: the aot graphs name both operators."""
    import torch._dynamo

    torch._dynamo.reset()
    graphs = []

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def capture(gm, example_inputs):
        graphs.append(str(gm.graph))
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=capture, bw_compiler=capture)
    q, k, v, do = inputs((1, 20, 20, 2, 2, 64), "bhsd", tag="graph")
    compiled = torch.compile(lambda q, k, v: flashjit.sdpa(q, k, v, is_causal=True),
                             fullgraph=True, backend=backend)
    torch.autograd.grad(compiled(q, k, v), (q, k, v), do)
    assert len(graphs) == 2, graphs
    assert "flashjit.attention.default" in graphs[0]
    assert "flashjit.attention_backward.default" in graphs[1]
    torch._dynamo.reset()
