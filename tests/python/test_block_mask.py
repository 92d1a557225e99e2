"""Block maps of a mask_mod (issue 31) through the Python API: flashjit.block_mask_stats, the map
the selected kernel reads (its tile, its build's device time, the shares of empty / partial /
full tiles). On the CPU backend (whose kernels read no map) it is None; on a GPU the 2048-token
documents' shares are the exact count of the tiles, and the attention() call of the same problem
matches the reference (the kernel builds and caches its own map). GPU tests skip cleanly without
one (FLASHJIT_EXPECT_GPU=1 makes that a failure)."""
import numpy as np
import pytest

import flashjit
from conftest import require_cpu_backend, require_gpu

DOCS = "(q_idx / 64) == (kv_idx / 64)"


def test_no_map_on_the_cpu_backend():
    require_cpu_backend()
    rng = np.random.default_rng(31)
    q, k, v = (rng.standard_normal((1, 200, 2, 64)).astype(np.float16) for _ in range(3))
    assert flashjit.block_mask_stats(q, k, v, causal=True, mask_mod=DOCS) is None
    assert flashjit.block_mask_stats(q, k, v, causal=True) is None


def test_a_bad_mask_mod_is_a_typed_error():
    require_cpu_backend()
    q = np.zeros((1, 16, 1, 64), dtype=np.float16)
    with pytest.raises(TypeError, match="mask_mod"):
        flashjit.block_mask_stats(q, q, q, mask_mod=3)
    with pytest.raises(flashjit.InvalidArgumentError, match="mask_mod"):
        flashjit.block_mask_stats(q, q, q, mask_mod="q_idx >= kv_idx; {")


def test_the_documents_map_on_a_gpu():
    require_gpu()
    import torch

    n, heads, d = 1000, 2, 128
    q, k, v = (torch.randn(1, n, heads, d, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    stats = flashjit.block_mask_stats(q, k, v, causal=True, mask_mod=DOCS)
    assert stats is not None, "the CUDA kernel of a mask_mod reads a block map"
    bm, bn = stats["block_m"], stats["block_n"]
    assert stats["maps"] == 1 and stats["build_ms"] >= 0
    # The host count of the same tiles: causal documents of 64.
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    seen = (j <= i) & (i // 64 == j // 64)
    qt, kt = -(-n // bm), -(-n // bn)
    counts = [0, 0, 0]
    for a in range(qt):
        for b in range(kt):
            tile = np.zeros((bm, bn), dtype=bool)
            block = seen[a * bm:(a + 1) * bm, b * bn:(b + 1) * bn]
            tile[:block.shape[0], :block.shape[1]] = block
            rows = min(bm, n - a * bm)
            tile = tile[:rows]
            counts[0 if not tile.any() else 2 if tile.all() else 1] += 1
    total = qt * kt
    assert stats["empty"] == pytest.approx(counts[0] / total)
    assert stats["partial"] == pytest.approx(counts[1] / total)
    assert stats["full"] == pytest.approx(counts[2] / total)
    # The call itself (its own map, built on first use) against SDPA with the boolean mask.
    out = flashjit.attention(q, k, v, causal=True, mask_mod=DOCS)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
        attn_mask=torch.tensor(seen, device="cuda")).transpose(1, 2)
    assert (out.float() - ref).norm() / ref.norm() < 1e-2
