"""Attention variants through the Python API on the CPU backend (numpy float16 in, numpy out):
sliding windows, softcap, ALiBi, prefix-LM, score_mod / mask_mod and combinations, against the
fp64 reference of each (conftest.reference_variant_attention) on fresh random inputs with odd
sizes, GQA/MQA, seqlen_q != seqlen_k both ways and rows that see no key; and the typed errors of
bad values, which come from the library's own validation."""
import math

import numpy as np
import pytest

import flashjit
from conftest import (lse_error, reference_variant_attention, relative_error, require_cpu_backend,
                      seed)

MAX_REL = 1e-2
MAX_LSE = 2e-3


def random(rng, shape, dtype=np.float16):
    return rng.standard_normal(shape).astype(dtype)


def slopes(heads):
    """ALiBi's geometric slopes (2^(-8 h / heads)), as BLOOM uses them."""
    return np.array([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], dtype=np.float32)


# (id, (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim), causal, layout, scale,
#  variant kwargs for flashjit, reference kwargs (the expressions as numpy functions))
CASES = [
    ("window-5-3-gqa-q<k", (1, 17, 300, 4, 2, 64), False, "bshd", None,
     dict(window=(5, 3)), dict(window=(5, 3))),
    ("window-5-causal-q>k-empty-rows", (2, 300, 17, 2, 2, 64), True, "bshd", None,
     dict(window=(5, -1)), dict(window=(5, -1))),
    ("window-left-unbounded-right-2", (1, 65, 33, 2, 1, 64), False, "bhsd", None,
     dict(window=(-1, 2)), dict(window=(-1, 2))),
    ("empty-window-q>k", (1, 40, 17, 2, 2, 64), False, "bshd", None,
     dict(window=(0, 0)), dict(window=(0, 0))),
    ("softcap-causal-gqa", (2, 33, 33, 4, 2, 64), True, "bshd", 1.0,
     dict(softcap=5.0), dict(softcap=5.0)),
    ("alibi-causal-mqa-1000", (1, 1000, 1000, 2, 1, 64), True, "bshd", None,
     dict(alibi=True), dict(alibi=True)),
    ("prefix-7-window-4-causal", (1, 77, 77, 2, 2, 64), True, "bshd", None,
     dict(prefix=7, window=(4, 0)), dict(prefix=7, window=(4, 0))),
    ("score-and-mask-mod-gqa-bhsd", (2, 50, 70, 4, 2, 64), False, "bhsd", None,
     dict(score_mod="score - 0.1f * abs(q_idx - kv_idx) + 0.01f * head",
          mask_mod="(q_idx / 8) == (kv_idx / 8) || (kv_idx + batch) % 5 == 0"),
     dict(score_mod=lambda s, b, h, i, j: s - 0.1 * np.abs(i - j) + 0.01 * h,
          mask_mod=lambda b, h, i, j: ((i // 8) == (j // 8)) | ((j + b) % 5 == 0))),
    ("window-softcap-alibi-gqa-causal-d128", (1, 129, 200, 4, 2, 128), True, "bshd", None,
     dict(window=(31, 0), softcap=2.0, alibi=True),
     dict(window=(31, 0), softcap=2.0, alibi=True)),
    ("all-of-them-seqlen-1", (3, 1, 1, 2, 1, 64), True, "bshd", None,
     dict(window=(0, 0), softcap=50.0, alibi=True, prefix=1, score_mod="score * 0.5f",
          mask_mod="kv_idx >= 0"),
     dict(window=(0, 0), softcap=50.0, alibi=True, prefix=1,
          score_mod=lambda s, b, h, i, j: s * 0.5, mask_mod=lambda b, h, i, j: j >= 0)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_variant_matches_fp64_reference(case):
    require_cpu_backend()
    name, (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim), causal, layout, scale, mine, \
        theirs = case
    rng = np.random.default_rng(seed("variant", name))

    def shape(seqlen, heads):
        if layout == "bshd":
            return (batch, seqlen, heads, head_dim)
        return (batch, heads, seqlen, head_dim)

    q = random(rng, shape(seqlen_q, heads_q))
    k = random(rng, shape(seqlen_k, heads_kv))
    v = random(rng, shape(seqlen_k, heads_kv))
    mine, theirs = dict(mine), dict(theirs)
    if mine.pop("alibi", False):
        mine["alibi_slopes"] = slopes(heads_q)
        theirs.pop("alibi")
        theirs["alibi_slopes"] = mine["alibi_slopes"]
    out = np.full(q.shape, np.nan, dtype=np.float16)  # poisoned: every element must be written
    lse = np.full((batch, heads_q, seqlen_q), np.nan, dtype=np.float32)
    flashjit.attention(q, k, v, causal=causal, scale=scale, layout=layout, out=out, lse=lse,
                       **mine)
    ref, ref_lse = reference_variant_attention(q, k, v, causal=causal, scale=scale, layout=layout,
                                               **theirs)
    assert relative_error(out, ref) < MAX_REL
    assert lse_error(lse, ref_lse) < MAX_LSE
    # The variant changes the result (else this test could not fail on a variant ignored): the
    # plain reference differs, except where the variant is a no-op by construction.
    plain, _ = reference_variant_attention(q, k, v, causal=causal, scale=scale, layout=layout)
    if name != "all-of-them-seqlen-1":
        assert relative_error(plain, ref) > 5 * MAX_REL


def test_empty_window_rows_are_zero_with_infinite_lse():
    require_cpu_backend()
    rng = np.random.default_rng(seed("empty-window"))
    q = random(rng, (1, 40, 2, 64))
    k = v = random(rng, (1, 17, 2, 64))
    out, lse = flashjit.attention(q, k, v, window=(0, 0), return_lse=True)
    # diagonal = 17 - 40: rows 0..22 have their only key before key 0.
    assert np.all(out[:, :23] == 0) and np.all(np.isposinf(lse[:, :, :23]))
    assert np.all(np.isfinite(lse[:, :, 23:]))


def test_plain_arguments_are_plain_attention():
    """window=(-1, -1), prefix=0, no softcap / mods: exactly the plain kernel (same problem)."""
    require_cpu_backend()
    rng = np.random.default_rng(seed("plain"))
    q, k, v = (random(rng, (1, 33, 2, 64)) for _ in range(3))
    a = flashjit.attention(q, k, v, causal=True)
    b = flashjit.attention(q, k, v, causal=True, window=(-1, -1), prefix=0, score_mod=None)
    assert np.array_equal(a, b)
    assert flashjit.config_for(q, k, v, causal=True, window=(-1, -1))["problem"] == \
        flashjit.config_for(q, k, v, causal=True)["problem"]
    assert "window(3,0)" in flashjit.config_for(q, k, v, causal=True, window=(3, 0))["problem"]


@pytest.mark.parametrize("kwargs, words", [
    (dict(window=(-2, 0)), ["window_left = -2", "-1 (unbounded)"]),
    (dict(window=(0, -5)), ["window_right = -5"]),
    (dict(window=(2**40, 0)), ["window_left = 1099511627776"]),
    (dict(softcap=0.0), ["softcap = 0", "finite and > 0"]),
    (dict(softcap=-3.0), ["softcap = -3"]),
    (dict(softcap=math.inf), ["softcap = inf"]),
    (dict(softcap=math.nan), ["softcap = nan"]),
    (dict(prefix=-1), ["prefix = -1"]),
    (dict(score_mod="score; return 0"), ["score_mod = \"score; return 0\"", "';'"]),
    (dict(mask_mod="{ true }"), ["mask_mod", "'{'"]),
    (dict(score_mod="score // comment"), ["comment"]),
    (dict(mask_mod="(q_idx < kv_idx"), ["unbalanced"]),
    (dict(alibi_slopes=np.ones(3, np.float32)), ["alibi_slopes.shape = (3,)", "(4,)"]),
    (dict(alibi_slopes=np.ones(4, np.float64)), ["alibi_slopes.dtype = float64", "float32"]),
    (dict(alibi_slopes=np.ones((4, 1), np.float32)), ["alibi_slopes.shape = (4, 1)"]),
    (dict(alibi_slopes=np.ones(8, np.float32)[::2]), ["alibi_slopes must be contiguous"]),
], ids=lambda x: repr(x)[:40] if isinstance(x, dict) else None)
def test_bad_values_raise_the_library_errors(kwargs, words):
    require_cpu_backend()
    q = np.zeros((1, 9, 4, 64), np.float16)
    k = v = np.zeros((1, 9, 2, 64), np.float16)
    with pytest.raises(flashjit.InvalidArgumentError) as error:
        flashjit.attention(q, k, v, **kwargs)
    assert error.value.code == "InvalidArgument"
    for word in words:
        assert word in str(error.value), (word, str(error.value))


@pytest.mark.parametrize("kwargs", [dict(window=3), dict(window=(1, 2, 3)), dict(window="ab"),
                                    dict(window=(1.5, 0)), dict(softcap="x"), dict(softcap=True),
                                    dict(prefix=2.0), dict(score_mod=3), dict(mask_mod=b"x")])
def test_wrong_types_raise_type_error(kwargs):
    q = k = v = np.zeros((1, 9, 2, 64), np.float16)
    with pytest.raises(TypeError):
        flashjit.attention(q, k, v, **kwargs)


def test_an_expression_that_does_not_compile_quotes_it_and_the_compiler():
    require_cpu_backend()
    q = k = v = np.zeros((1, 9, 2, 64), np.float16)
    with pytest.raises(flashjit.Error) as error:
        flashjit.attention(q, k, v, score_mod="score + no_such_thing(q_idx)")
    assert error.value.code == "CompileFailed"
    text = str(error.value)
    assert text.startswith('score_mod = "score + no_such_thing(q_idx)" does not compile: ')
    assert "no_such_thing" in text.splitlines()[0]
