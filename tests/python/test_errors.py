"""Bad inputs raise flashjit exceptions carrying the library's message (checked word for word
where it names the value). Most checks happen before any backend is involved, so they run on
every build."""
import numpy as np
import pytest

import flashjit
from conftest import require_cpu_backend


def arrays(q_shape=(1, 17, 4, 64), kv_shape=None, dtype=np.float16):
    rng = np.random.default_rng(0)
    kv_shape = q_shape if kv_shape is None else kv_shape
    return (rng.standard_normal(q_shape).astype(dtype),
            rng.standard_normal(kv_shape).astype(dtype),
            rng.standard_normal(kv_shape).astype(dtype))


def raises(kind, fragment, *args, **kwargs):
    with pytest.raises(kind) as info:
        flashjit.attention(*args, **kwargs)
    assert fragment in str(info.value), str(info.value)
    return info.value


def test_exception_hierarchy():
    assert issubclass(flashjit.Error, RuntimeError)
    assert issubclass(flashjit.InvalidArgumentError, flashjit.Error)
    assert issubclass(flashjit.InvalidArgumentError, ValueError)
    assert issubclass(flashjit.UnsupportedError, flashjit.Error)
    assert issubclass(flashjit.UnsupportedError, ValueError)
    assert issubclass(flashjit.NoDeviceError, flashjit.Error)


def test_errors_raised_in_python_carry_their_code():
    q, k, v = arrays()
    with pytest.raises(flashjit.InvalidArgumentError) as info:
        flashjit.attention(q, k, v, deterministic=True)
    assert info.value.code == "InvalidArgument"
    assert flashjit.UnsupportedError("x").code == "Unsupported"
    assert flashjit.NoDeviceError("x").code == "NoDevice"


def test_float32_on_cuda_is_the_backends_unsupported_error():
    from conftest import require_gpu

    require_gpu()
    import torch

    q, k, v = (torch.from_numpy(x).cuda() for x in arrays(dtype=np.float32))
    error = raises(flashjit.UnsupportedError, "q.dtype = float32 on cuda:0: flashjit's CUDA kernels "
                   "take bfloat16 or float16. Run the model under torch.autocast", q, k, v)
    assert error.code == "Unsupported"
    # The DLPack path (out= given) reaches the backend's own check.
    error = raises(flashjit.UnsupportedError,
                   "dtype = f32: the CUDA backend supports f16 and bf16 storage only", q, k, v,
                   out=torch.empty_like(q))
    assert error.code == "Unsupported"


@pytest.mark.parametrize("dtype,name", [(np.float64, "float64"), (np.int8, "int8"),
                                        (np.uint16, "uint16")])
def test_wrong_dtype(dtype, name):
    error = raises(flashjit.InvalidArgumentError,
                   f"q.dtype = {name}: must be float16, bfloat16 or float32",
                   *arrays(dtype=dtype))
    assert error.code == "InvalidArgument"


def test_mixed_dtypes():
    q, k, v = arrays()
    raises(flashjit.InvalidArgumentError, "v.dtype = float32", q, k, v.astype(np.float32))
    raises(flashjit.InvalidArgumentError, "out.dtype = float32: must match q.dtype = float16",
           q, k, v, out=np.empty(q.shape, np.float32))


def test_wrong_rank():
    q, k, v = arrays()
    raises(flashjit.InvalidArgumentError,
           "q.ndim = 3 (shape (17, 4, 64)): must be 4, (batch, seqlen, heads, head_dim) for "
           "layout bshd", q[0], k, v)
    raises(flashjit.InvalidArgumentError,
           "(batch, heads, seqlen, head_dim) for layout bhsd", q[0], k, v, layout="bhsd")


def test_last_dim_not_contiguous():
    q, k, v = arrays(q_shape=(1, 17, 4, 128))
    raises(flashjit.InvalidArgumentError,
           "q is not contiguous in its last (head_dim) dimension (stride 2)",
           q[..., ::2], k[..., ::2], v[..., ::2])


def test_head_dim():
    raises(flashjit.InvalidArgumentError, "head_dim = 12 (q.shape (1, 17, 4, 12)): must be a "
           "multiple of 8 in [8, 256]", *arrays(q_shape=(1, 17, 4, 12)))
    raises(flashjit.InvalidArgumentError, "head_dim = 264",
           *arrays(q_shape=(1, 17, 4, 264)))


def test_heads_must_divide():
    raises(flashjit.InvalidArgumentError, "heads_kv = 3: must divide heads_q = 4",
           *arrays(q_shape=(1, 17, 4, 64), kv_shape=(1, 17, 3, 64)))


def test_shape_mismatches():
    q, k, v = arrays()
    raises(flashjit.InvalidArgumentError, "v.shape = (1, 16, 4, 64): must equal k.shape = "
           "(1, 17, 4, 64)", q, k, v[:, :16])
    raises(flashjit.InvalidArgumentError, "batch 2 must equal q's 1",
           *arrays(q_shape=(1, 17, 4, 64), kv_shape=(2, 17, 4, 64)))
    raises(flashjit.InvalidArgumentError, "head_dim 128 must equal q's 64",
           *arrays(q_shape=(1, 17, 4, 64), kv_shape=(1, 17, 4, 128)))
    raises(flashjit.InvalidArgumentError, "out.shape = (1, 17, 4, 32): must equal q.shape",
           q, k, v, out=np.empty((1, 17, 4, 32), np.float16))
    raises(flashjit.InvalidArgumentError, "lse.shape = (1, 17, 4): must be (batch, heads, "
           "seqlen_q) = (1, 4, 17)", q, k, v, lse=np.empty((1, 17, 4), np.float32))
    raises(flashjit.InvalidArgumentError, "lse.dtype = float16: must be float32",
           q, k, v, lse=np.empty((1, 4, 17), np.float16))


def test_strides_must_be_multiples_of_8():
    q, k, v = arrays(q_shape=(1, 17, 4, 68))
    raises(flashjit.InvalidArgumentError,
           "q.head stride = 68: must be a non-negative multiple of 8 elements",
           q[..., :64], k[..., :64], v[..., :64])


def test_output_must_not_overlap_itself():
    q, k, v = arrays()
    out = np.lib.stride_tricks.as_strided(np.empty(17 * 64, np.float16), shape=q.shape,
                                          strides=(0, 64 * 2, 0, 2))
    raises(flashjit.InvalidArgumentError, "make elements overlap", q, k, v, out=out)


def test_bad_layout():
    raises(flashjit.InvalidArgumentError, "layout = 'sbhd': must be 'bshd'", *arrays(),
           layout="sbhd")


def test_not_an_array():
    q, k, v = arrays()
    with pytest.raises(TypeError, match="k: expected an array"):
        flashjit.attention(q, [[1.0]], v)


def test_bad_stream():
    with pytest.raises(TypeError, match="stream: expected an int handle"):
        flashjit.attention(*arrays(), stream="default")


def test_bad_config():
    require_cpu_backend()
    raises(flashjit.InvalidArgumentError, "config = 'fast': expected the form "
           "m<block_m>n<block_n>w<warps>s<stages>", *arrays(), config="fast")
    raises(flashjit.InvalidArgumentError, "config = 'm16n32w4s2' is not legal for this problem",
           *arrays(), config="m16n32w4s2")


def test_cpu_arrays_without_cpu_backend():
    if flashjit.have_cpu_backend():
        pytest.skip("this build has the CPU backend")
    error = raises(flashjit.UnsupportedError,
                   "CPU arrays run on flashjit's CPU backend, and this build has none",
                   *arrays())
    assert error.code == "Unsupported"


# --- the backward pass: checked before any backend is involved ----------------------------------

def backward_arrays(q_shape=(1, 17, 4, 64), kv_shape=(1, 17, 2, 64)):
    """q, k, v, o, lse, do for attention_backward (values irrelevant: only the checks run)."""
    q, k, v = arrays(q_shape, kv_shape)
    lse = np.zeros((q_shape[0], q_shape[2], q_shape[1]), np.float32)
    return q, k, v, q.copy(), lse, q.copy()


def backward_raises(kind, fragment, *args, **kwargs):
    with pytest.raises(kind) as info:
        flashjit.attention_backward(*args, **kwargs)
    assert fragment in str(info.value), str(info.value)
    return info.value


def test_backward_do_and_o_shape_and_dtype():
    q, k, v, o, lse, do = backward_arrays()
    backward_raises(flashjit.InvalidArgumentError,
                    "do.shape = (1, 16, 4, 64): must equal q.shape = (1, 17, 4, 64)",
                    q, k, v, o, lse, do[:, :16])
    backward_raises(flashjit.InvalidArgumentError,
                    "do.dtype = float32: must match q.dtype = float16",
                    q, k, v, o, lse, do.astype(np.float32))
    backward_raises(flashjit.InvalidArgumentError,
                    "o.shape = (1, 17, 2, 64): must equal q.shape = (1, 17, 4, 64)",
                    q, k, v, o[:, :, :2], lse, do)
    backward_raises(flashjit.InvalidArgumentError, "o.dtype = float32: must match q.dtype",
                    q, k, v, o.astype(np.float32), lse, do)
    backward_raises(flashjit.InvalidArgumentError, "do is not contiguous in its last (head_dim)",
                    q, k, v, o, lse, np.repeat(do, 2, axis=3)[..., ::2])


def test_backward_lse_missing_shape_dtype():
    q, k, v, o, lse, do = backward_arrays()
    error = backward_raises(flashjit.InvalidArgumentError,
                            "lse is None: the backward pass needs the forward's log-sum-exp, "
                            "float32 (batch, heads, seqlen_q): o, lse = flashjit.attention(q, k, "
                            "v, ..., return_lse=True)", q, k, v, o, None, do)
    assert error.code == "InvalidArgument"
    backward_raises(flashjit.InvalidArgumentError,
                    "lse.shape = (1, 17, 4): must be (batch, heads, seqlen_q) = (1, 4, 17)",
                    q, k, v, o, np.zeros((1, 17, 4), np.float32), do)
    backward_raises(flashjit.InvalidArgumentError, "lse.dtype = float16: must be float32",
                    q, k, v, o, lse.astype(np.float16), do)
    backward_raises(flashjit.InvalidArgumentError, "lse must be contiguous",
                    q, k, v, o, np.zeros((1, 17, 4), np.float32).transpose(0, 2, 1), do)


def test_backward_gradient_outputs():
    q, k, v, o, lse, do = backward_arrays()
    backward_raises(flashjit.InvalidArgumentError, "dq.shape = (1, 17, 2, 64): must equal "
                    "q.shape = (1, 17, 4, 64)", q, k, v, o, lse, do,
                    dq=np.empty((1, 17, 2, 64), np.float16))
    backward_raises(flashjit.InvalidArgumentError, "dk.dtype = float32: must match k.dtype = "
                    "float16", q, k, v, o, lse, do, dk=np.empty(k.shape, np.float32))
    backward_raises(flashjit.InvalidArgumentError, "dv.shape = (1, 17, 4, 64): must equal "
                    "k.shape = (1, 17, 2, 64)", q, k, v, o, lse, do, dv=np.empty(q.shape,
                                                                                 np.float16))
    overlapping = np.lib.stride_tricks.as_strided(np.empty(17 * 64, np.float16), shape=k.shape,
                                                  strides=(0, 64 * 2, 0, 2))
    backward_raises(flashjit.InvalidArgumentError, "make elements overlap", q, k, v, o, lse, do,
                    dk=overlapping)


def test_backward_shapes_of_the_inputs_and_arrays():
    q, k, v, o, lse, do = backward_arrays()
    backward_raises(flashjit.InvalidArgumentError, "heads_kv = 3: must divide heads_q = 4",
                    *backward_arrays(kv_shape=(1, 17, 3, 64)))
    backward_raises(flashjit.InvalidArgumentError, "layout = 'sbhd'", q, k, v, o, lse, do,
                    layout="sbhd")
    with pytest.raises(TypeError, match="do: expected an array"):
        flashjit.attention_backward(q, k, v, o, lse, [[1.0]])
    with pytest.raises(TypeError, match="lse: expected an array"):
        flashjit.attention_backward(q, k, v, o, "lse", do)


def test_pass_and_deterministic_arguments():
    q, k, v = arrays()
    with pytest.raises(flashjit.InvalidArgumentError,
                       match="pass = 'sideways': must be fwd .forward. or bwd .backward."):
        flashjit.config_for(q, k, v, pass_="sideways")
    with pytest.raises(flashjit.InvalidArgumentError,
                       match="deterministic = True applies to the backward pass only"):
        flashjit.config_for(q, k, v, deterministic=True)
    with pytest.raises(flashjit.InvalidArgumentError, match="pass = 'x'"):
        flashjit.show(arch="sm90", pass_="x")
    with pytest.raises(flashjit.InvalidArgumentError, match="deterministic = True applies"):
        flashjit.show(arch="sm90", deterministic=True)
