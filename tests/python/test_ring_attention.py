"""flashjit.distributed.ring_attention: context-parallel attention over torch.distributed.

CPU: the gloo backend with 2 and 4 processes (torch.multiprocessing spawn, a file:// rendezvous),
float32: each rank's rows of the output and of dq, dk, dv against single-process flashjit on the
full sequence and an fp64 reference, causal and not, zig-zag and contiguous splits, odd chunk
lengths, GQA, window / softcap / ALiBi on global positions; typed errors. GPU: the same on 2 GPUs
with NCCL in bfloat16 (skips without 2 CUDA devices).
"""
import math
import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import flashjit  # noqa: E402

# The CPU tests run flashjit's CPU backend; the GPU test runs without it (the GPU machines'
# builds may lack LLVM).
needs_cpu_backend = pytest.mark.skipif(not flashjit.have_cpu_backend(),
                                       reason="flashjit was built without the CPU backend")

from flashjit import distributed as fd  # noqa: E402

# (name, split, local n, causal, variant kwargs, heads, heads_kv, batch). Few variant cases:
# every distinct window/softcap/ALiBi block kernel is a CPU JIT compile (or a cache load) per
# process.
CASES_2 = [
    ("contig-full-odd", "contiguous", 7, False, {}, 4, 2, 2),
    ("contig-causal-odd", "contiguous", 9, True, {}, 4, 4, 1),
    ("zigzag-causal-odd-chunks", "zigzag", 10, True, {}, 4, 2, 1),
    ("zigzag-full", "zigzag", 6, False, {}, 2, 1, 2),
    ("zigzag-causal-window-softcap-alibi", "zigzag", 10, True,
     {"window": (6, 0), "softcap": 5.0, "alibi": True}, 4, 2, 1),
    ("contig-window-2sided", "contiguous", 9, False, {"window": (4, 3)}, 2, 2, 1),
]
CASES_4 = [
    ("zigzag-causal-odd-chunks", "zigzag", 6, True, {}, 4, 2, 1),
    ("contig-causal-odd", "contiguous", 5, True, {}, 2, 1, 1),
    ("contig-full-gqa", "contiguous", 3, False, {}, 4, 1, 1),
]


def _reference(q, k, v, causal, scale, window, softcap, slopes):
    """fp64 attention of full (B, S, H, D) tensors with global positions."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))  # (B, H, S, D)
    groups = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(groups, dim=1) for x in (k, v))
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    pos = torch.arange(q.shape[2], device=q.device)  # the mask where the scores are
    dist_ = (pos[None, :] - pos[:, None]).double()  # kv - q
    if slopes is not None:
        s = s + slopes.double()[None, :, None, None] * dist_
    mask = torch.ones_like(dist_, dtype=torch.bool)
    left, right = window if window is not None else (-1, -1)
    if causal:
        mask &= dist_ <= 0
    elif right >= 0:
        mask &= dist_ <= right
    if left >= 0:
        mask &= dist_ >= -left
    s = s.masked_fill(~mask, -math.inf)
    return (torch.softmax(s, dim=-1) @ v).transpose(1, 2)


def _inputs(seed, batch, length, heads, heads_kv, dim=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, length, heads, dim, generator=g)
    k = torch.randn(batch, length, heads_kv, dim, generator=g)
    v = torch.randn(batch, length, heads_kv, dim, generator=g)
    do = torch.randn(batch, length, heads, dim, generator=g)
    slopes = torch.rand(heads, generator=g) * 0.5 + 0.05
    return q, k, v, do, slopes


def _check_close(name, what, got, want, atol=2e-4, rtol=2e-4):
    if not torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol):
        err = (got.double() - want.double()).abs().max().item()
        raise AssertionError(f"{name}: {what} differs by up to {err:.3g}")


def _run_case(case, rank, world, seed):
    name, split, n, causal, variant, heads, heads_kv, batch = case
    q, k, v, do, slopes = _inputs(seed, batch, n * world, heads, heads_kv)
    window, softcap = variant.get("window"), variant.get("softcap")
    slopes = slopes if variant.get("alibi") else None
    scale = 1 / math.sqrt(q.shape[-1])
    kwargs = dict(window=window, softcap=softcap, alibi_slopes=slopes)
    # single-process flashjit on the full sequence, and the fp64 reference
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    o_flash = flashjit.attention(*full, causal=causal, **kwargs)
    o_flash.backward(do)
    o_ref = _reference(q, k, v, causal, scale, window, softcap, slopes)
    ref64 = [x.double().requires_grad_() for x in (q, k, v)]
    _reference(*ref64, causal, scale, window, softcap, slopes).backward(do.double())

    local = [fd.split_sequence(x, world, rank, split).requires_grad_() for x in (q, k, v)]
    o, lse = fd.ring_attention(*local, causal=causal, split=split, return_lse=True, **kwargs)
    assert o.shape == local[0].shape and o.dtype == torch.float32
    o.backward(fd.split_sequence(do, world, rank, split))
    mine = lambda x: fd.split_sequence(x, world, rank, split)  # noqa: E731
    _check_close(name, "o vs fp64", o, mine(o_ref))
    _check_close(name, "o vs flashjit", o, mine(o_flash.detach()))
    if slopes is None:  # (flashjit's own lse is the one to compare with; ALiBi's is global here)
        _, lse_flash = flashjit.attention(q, k, v, causal=causal, return_lse=True, **kwargs)
        _check_close(name, "lse vs flashjit", lse, fd.split_sequence(lse_flash, world, rank,
                                                                     split, dim=2))
    for label, x, flash, ref in zip(("dq", "dk", "dv"), local, full, ref64):
        _check_close(name, label + " vs fp64", x.grad, mine(ref.grad))
        _check_close(name, label + " vs flashjit", x.grad, mine(flash.grad))


def _check_errors(rank, world):
    q = torch.randn(1, 5, 2, 16)
    with pytest.raises(flashjit.InvalidArgumentError, match="must be even"):
        fd.ring_attention(q, q, q, split="zigzag")
    with pytest.raises(flashjit.InvalidArgumentError, match="split"):
        fd.ring_attention(q, q, q, split="ring")
    with pytest.raises(flashjit.UnsupportedError, match="cu_seqlens"):
        fd.ring_attention(q, q, q, cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(flashjit.UnsupportedError, match="score_mod"):
        fd.ring_attention(q, q, q, score_mod="score")
    with pytest.raises(flashjit.UnsupportedError, match="same positions"):
        fd.ring_attention(q, q[:, :4], q[:, :4])
    uneven = torch.randn(1, 5 + rank, 2, 16)  # every rank raises (an all_gather, no hang)
    with pytest.raises(flashjit.InvalidArgumentError, match="same number of rows"):
        fd.ring_attention(uneven, uneven, uneven)


def _check_compile(rank, world):
    """ring_attention inside a torch.compile'd function (a graph break at the call: it is
    torch.compiler.disable'd), forward and gradients as eager."""
    q, k, v, do, _ = _inputs(99, 1, 8 * world, 2, 1)
    local = [fd.zigzag_split(x, world, rank) for x in (q, k, v)]

    def f(q, k, v):
        o = fd.ring_attention(torch.sin(q) * 2, k, v, causal=True, split="zigzag")
        return (o * o).sum()

    compiled = torch.compile(f, backend="aot_eager")
    results = []
    for fn in (f, compiled):
        inputs = [x.clone().requires_grad_() for x in local]
        loss = fn(*inputs)
        loss.backward()
        results.append([loss.detach()] + [x.grad for x in inputs])
    for label, a, b in zip(("loss", "dq", "dk", "dv"), *results):
        _check_close("torch.compile", label, a, b, atol=1e-5, rtol=1e-5)


def _worker(rank, world, init, cases, seed, check_errors):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        for i, case in enumerate(cases):
            _run_case(case, rank, world, seed + i)
        if check_errors:
            _check_errors(rank, world)
            _check_compile(rank, world)
    finally:
        dist.destroy_process_group()


def _warm_kernels(world, cases):
    """Compiles, in this process, the kernels the ranks will run (every block call's forward and
    backward, and the full-sequence flashjit of the comparison), so that the ranks load them from
    the disk cache (conftest's FLASHJIT_CACHE_DIR) instead of each compiling them (the cache is
    fresh per session; world processes compiling the same kernel cost world times the CPU)."""
    for name, split, n, causal, variant, heads, heads_kv, batch in cases:
        q, k, v, do, slopes = _inputs(0, batch, n * world, heads, heads_kv)
        kwargs = dict(window=variant.get("window"), softcap=variant.get("softcap"),
                      alibi_slopes=slopes if variant.get("alibi") else None)
        full = [x.clone().requires_grad_() for x in (q, k, v)]
        flashjit.attention(*full, causal=causal, **kwargs).backward(do)
        segs = [fd._segments(split, world, r, n) for r in range(world)]
        for rank in range(world):
            for src in range(world):
                for c in fd._plan(segs[rank], segs[src], causal, kwargs["window"],
                                  variant.get("alibi", False)):
                    args = [x[:, :c.qb - c.qa] for x in (q, do)] + \
                        [x[:, :c.kb - c.ka] for x in (k, v)]
                    call = dict(kwargs, window=c.window, causal=c.causal)
                    o, lse = flashjit.attention(args[0], args[2], args[3], return_lse=True,
                                                **call)
                    flashjit.attention_backward(args[0], args[2], args[3], o, lse, args[1],
                                                **call)


def _spawn(tmp_path, world, cases, check_errors=False):
    _warm_kernels(world, cases)
    init = "file://" + str(tmp_path / "rendezvous")
    mp.spawn(_worker, args=(world, init, cases, 1234, check_errors), nprocs=world, join=True)


def test_split_helpers_round_trip():
    x = torch.randn(2, 24, 3, 4)
    for world in (1, 2, 3):
        for split in fd.SPLITS:
            parts = [fd.split_sequence(x, world, r, split) for r in range(world)]
            assert torch.equal(fd.merge_sequence(parts, split), x)
    parts = [fd.zigzag_split(x, 2, r) for r in range(2)]
    assert torch.equal(parts[0], torch.cat((x[:, :6], x[:, 18:]), dim=1))
    with pytest.raises(flashjit.InvalidArgumentError, match="divisible by 2 \\* world_size = 10"):
        fd.zigzag_split(x, 5, 0)
    with pytest.raises(flashjit.InvalidArgumentError, match="rank = 2"):
        fd.zigzag_split(x, 2, 2)


def test_plan_structure():
    """Zig-zag causal with 4 ranks: rank 1's block pairs take the calls of the known structure
    (own block: one causal call; an earlier rank's: both query chunks against its first chunk;
    a later rank's: the second query chunk against both its chunks)."""
    segs = lambda r: fd._segments("zigzag", 4, r, 6)  # noqa: E731
    own = fd._plan(segs(1), segs(1), True, None, False)
    assert [(c.qa, c.qb, c.ka, c.kb, c.causal) for c in own] == [(0, 6, 0, 6, True)]
    earlier = fd._plan(segs(1), segs(0), True, None, False)
    assert [(c.qa, c.qb, c.ka, c.kb, c.causal) for c in earlier] == [(0, 6, 0, 3, False)]
    later = fd._plan(segs(1), segs(3), True, None, False)
    assert [(c.qa, c.qb, c.ka, c.kb, c.causal) for c in later] == [(3, 6, 0, 6, False)]


@needs_cpu_backend
def test_ring_attention_gloo_2_ranks(tmp_path):
    _spawn(tmp_path, 2, CASES_2, check_errors=True)


@needs_cpu_backend
def test_ring_attention_gloo_4_ranks(tmp_path):
    _spawn(tmp_path, 4, CASES_4)


def test_not_initialized():
    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(flashjit.InvalidArgumentError, match="init_process_group"):
        fd.ring_attention(q, q, q)


@needs_cpu_backend
def test_train_gpt_cp_two_ranks_matches_one_rank(tmp_path):
    """examples/train_gpt_cp.py under torchrun with 2 CPU ranks (gloo, zig-zag split), a few
    steps of the tiny preset: the same per-step loss as train_gpt.py's one-rank run (--compare)."""
    import json
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    report = tmp_path / "cp.json"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(flashjit.__path__[0]),
                                                        os.environ.get("PYTHONPATH")])))
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         os.path.join(repo, "examples", "train_gpt_cp.py"), "--preset", "tiny", "--steps", "8",
         "--log-every", "4", "--eval-batches", "1", "--compare", "--json", str(report)],
        env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    saved = json.loads(report.read_text())
    assert saved["context_parallel"] == 2 and len(saved["run"]["loss"]) == 8
    assert saved["max_step_difference"] < 1e-4, saved
    assert "context-parallel vs one rank" in run.stdout


def _gpu_worker(rank, world, init):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
    try:
        device = torch.device("cuda", rank)
        for split, causal, window in (("zigzag", True, None), ("contiguous", False, None),
                                      ("zigzag", True, (300, 0))):
            q, k, v, do, _ = _inputs(7, 2, 1024 * world, 8, 2, dim=128)
            q, k, v, do = (x.to(device, torch.bfloat16) for x in (q, k, v, do))
            full = [x.clone().requires_grad_() for x in (q, k, v)]
            o_flash = flashjit.attention(*full, causal=causal, window=window)
            o_flash.backward(do)
            ref64 = [x.double().requires_grad_() for x in (q, k, v)]
            o_ref = _reference(*ref64, causal, 1 / math.sqrt(128), window, None, None)
            o_ref.backward(do.double())
            mine = lambda x: fd.split_sequence(x, world, rank, split)  # noqa: E731
            local = [mine(x).detach().requires_grad_() for x in (q, k, v)]
            o = fd.ring_attention(*local, causal=causal, split=split, window=window)
            o.backward(mine(do))
            torch.cuda.synchronize()
            for label, got, flash, ref in zip(
                    ("o", "dq", "dk", "dv"), [o] + [x.grad for x in local],
                    [o_flash] + [x.grad for x in full], [o_ref] + [x.grad for x in ref64]):
                scale_ = mine(ref).abs().max().item()
                for what, want, tol in (("fp64", mine(ref), 2e-2), ("flashjit", mine(flash),
                                                                     2e-2)):
                    err = (got.double() - want.double()).abs().max().item() / scale_
                    assert err < tol, f"{split} causal={causal} window={window}: {label} vs " \
                                      f"{what}: relative error {err:.3g}"
    finally:
        dist.destroy_process_group()


def test_ring_attention_nccl_2_gpus(tmp_path):
    """2 GPUs, NCCL, bfloat16, head_dim 128, N 2048 (zig-zag causal, contiguous full, a causal
    window): each rank's o, dq, dk, dv against one-GPU flashjit and fp64 (relative to the largest
    value). Skips without 2 CUDA devices."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    if not dist.is_nccl_available():
        pytest.skip("torch without NCCL")
    init = "file://" + str(tmp_path / "rendezvous")
    mp.spawn(_gpu_worker, args=(2, init), nprocs=2, join=True)


def _flash_mask(rows, keys, causal, window):
    """flashjit's mask of a call: bottom-right aligned causal and window (set of (i, j))."""
    diagonal = keys - rows
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0
    return {(i, j) for i in range(rows) for j in range(keys)
            if (left < 0 or j >= i + diagonal - left) and (right < 0 or j <= i + diagonal + right)}


@pytest.mark.parametrize("split", fd.SPLITS)
def test_plan_masks_match_global_positions(split):
    """Every ring step's flashjit calls, masks emulated as flashjit applies them (bottom-right),
    cover exactly the (query, key) pairs the global mask shows, once each, and the ALiBi offsets
    turn the calls' local (key - query) into the global one. Pure Python: every split, 1-4 ranks,
    even/odd chunk lengths, causal or not, windows of every kind."""
    windows = (None, (0, 0), (3, 0), (5, 2), (0, -1), (-1, 4), (7, -1), (2, 9), (40, 40))
    for world in (1, 2, 3, 4):
        for n in ((6, 10) if split == "zigzag" else (5, 8)):
            segs = [fd._segments(split, world, r, n) for r in range(world)]
            pos = [[g + i for _, g, length in s for i in range(length)] for s in segs]
            for causal in (False, True):
                for window in windows:
                    left, right = window if window is not None else (-1, -1)
                    for rank in range(world):
                        for src in range(world):
                            want = set()
                            for i, p in enumerate(pos[rank]):
                                for j, kp in enumerate(pos[src]):
                                    if ((not causal or kp <= p) and (left < 0 or kp >= p - left)
                                            and (causal or right < 0 or kp <= p + right)):
                                        want.add((i, j))
                            got = []
                            for alibi in (False, True):
                                calls = fd._plan(segs[rank], segs[src], causal, window, alibi)
                                cover = []
                                for c in calls:
                                    mask = _flash_mask(c.qb - c.qa, c.kb - c.ka, c.causal,
                                                       c.window)
                                    cover += [(i + c.qa, j + c.ka) for i, j in mask]
                                    if alibi:
                                        for i, j in mask:
                                            row = i + c.qa
                                            off = [o for a, b, o in c.q_off if a <= row < b]
                                            assert len(off) == 1, (c, row)
                                            shift = c.k_off + c.ka - off[0] - c.qa
                                            assert pos[src][j + c.ka] - pos[rank][row] == \
                                                (j - i) + shift, (c, i, j)
                                assert len(cover) == len(set(cover)), (world, n, causal, window)
                                got.append(set(cover))
                            where = (split, world, n, causal, window, rank, src)
                            assert got[0] == want and got[1] == want, where


@needs_cpu_backend
def test_one_rank_is_flashjit(tmp_path):
    """A group of one rank (in this process): ring_attention is flashjit's attention (forward,
    lse and gradients), the variants included."""
    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "rendezvous"),
                            rank=0, world_size=1)
    try:
        _run_case(("one-rank-causal", "zigzag", 10, True, {}, 4, 2, 1), 0, 1, 5)
        _run_case(("one-rank-window-alibi", "contiguous", 9, False,
                   {"window": (4, 3), "alibi": True}, 2, 2, 1), 0, 1, 6)
    finally:
        dist.destroy_process_group()
