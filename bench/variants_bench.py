"""Attention variants (issue 17): flashjit against torch.compile'd FlexAttention and torch SDPA,
in the same process, d 128 bf16: the forward, and with --backward also the backward against
autograd through the compiled flex_attention (bench/variants_bwd.py; no SDPA there).

    python3 bench/variants_bench.py --out-dir DIR [--seqlens 8192,16384] [--reps 30] [--quick]
    python3 bench/variants_bench.py --dry-run [--backward]  # no GPU: the cases, each variant
        # checked against FlexAttention at a tiny size on the CPU (the backward against autograd
        # through the same mods computed densely: Flex has no CPU backward)

Cases (all causal, bottom-right = top-left here since seqlen_q == seqlen_k):
  causal          plain causal attention
  causal-variant  the same through the variant machinery: window=(N, 0) covers every key, so the
                  result is causal attention's but the kernel is the variant's (its mask, block
                  range and score path): the "a variant adds no cost" check. (window=(-1, -1) is
                  no variant at all: the same problem, the same kernel source as plain; the run
                  checks that through config_for and says so.)
  window1024      sliding window of 1024 keys to the left of the diagonal
  documents2048   document masking with equal-length documents of 2048 tokens, expressed as the
                  mask_mod "(q_idx / 2048) == (kv_idx / 2048)" (its mask_mod kernel visits every
                  key block of the causal band and masks per element; FlexAttention's block mask
                  skips the blocks outside the documents; documents-varlen below is the cu_seqlens
                  form)
  documents-random  documents of random lengths (uniform in [256, 4096], seeded, the last cut to
                  fit) in each sequence of N, as a mask_mod comparing document ids written as sums
                  of boundary tests ("((q_idx >= 1234) + ...) == ((kv_idx >= 1234) + ...)"):
                  the mask_mod path on documents that do not align with the tiles (issue 31);
                  Flex: its document_id mask_mod + causal; SDPA: the boolean mask
  documents-varlen  document masking with random document lengths (uniform in [256, 4096],
                  seeded, the last cut to fit) packing all B x N tokens: flashjit's packed
                  variable-length documents (cu_seqlens, q/k/v (total, H, d)) against
                  FlexAttention's document_id mask_mod + causal over the same documents (one
                  sequence of B x N tokens, create_block_mask over it); no SDPA
  softcap50       scores 50 * tanh(s / 50)
  alibi           ALiBi with the geometric slopes 2^(-8 (h + 1) / H)
Shapes: batch x heads from 16k tokens and hidden 2048 (H = 16, B = 16384 / N), as the other
benches. FlexAttention: flex_attention under torch.compile, its block masks created once outside
the timed loop (create_block_mask), score_mods as Python functions, the way a user writes them.
SDPA: is_causal for plain causal (its flash backend), an explicit attn_mask where one expresses
the variant (window, documents: boolean; ALiBi: an additive float bias), nothing for softcap.
Each timing: CUDA events around each call, warm-up first, the median of --reps calls; TFLOP/s
count the visible (query, key) pairs exactly: 4 * B * H * d * pairs. Ratios are same-run:
flex_ms / flashjit_ms (> 1: flashjit faster). Also the relative L2 difference of flashjit's
output to FlexAttention's (both bf16), which must be small.
A mask_mod case also records its block map (flashjit.block_mask_stats: block_map_ms, the build's
own device time, and block_map_tiles, the shares of empty / partial / full tiles at the default
kernel's tile); the timed calls reuse the map the kernel built on its first call.
Writes variants.md and variants.json to --out-dir.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

from variants_bwd import backward_row, backward_table

HIDDEN = 2048
TOKENS = 16384
HEAD_DIM = 128
WINDOW = 1024
DOCUMENT = 2048
SOFTCAP = 50.0
DOC_MIN, DOC_MAX = 256, 4096  # documents-varlen: document lengths, uniform in [DOC_MIN, DOC_MAX]

CASES = ("causal", "causal-variant", "window1024", "documents2048", "documents-random",
         "documents-varlen", "softcap50", "alibi")


def document_lengths(total, seed=17):
    """documents-varlen: lengths uniform in [DOC_MIN, DOC_MAX] (seeded) summing to `total`
    (the last cut to fit)."""
    import random

    rng = random.Random(seed)
    lengths = []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(DOC_MIN, DOC_MAX), total - sum(lengths)))
    return lengths


def random_documents(n):
    """documents-random: the lengths of its documents in a sequence of n (seeded per n)."""
    return document_lengths(n, seed=29 + n)


def random_documents_mask_mod(n):
    """documents-random as a flashjit mask_mod: equal document ids, each id a sum of boundary
    tests."""
    boundaries, at = [], 0
    for length in random_documents(n)[:-1]:
        at += length
        boundaries.append(at)
    if not boundaries:
        return "true"

    def doc_id(x):
        return " + ".join(f"({x} >= {b})" for b in boundaries)

    return f"({doc_id('q_idx')}) == ({doc_id('kv_idx')})"


def random_documents_ids(n, device):
    import torch

    lengths = random_documents(n)
    return torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                   torch.tensor(lengths, device=device))


def varlen_inputs(q, k, v):
    """documents-varlen: q, k, v (B, H, N, d) packed into (B N, H, d) (one sequence of every
    token), flashjit's varlen arguments and FlexAttention's document mask_mod over them."""
    import torch

    batch, heads, n, d = q.shape
    total = batch * n
    lengths = document_lengths(total)
    packed = [x.transpose(1, 2).reshape(total, heads, d).contiguous() for x in (q, k, v)]
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    cu = torch.tensor(offsets, dtype=torch.int32, device=q.device)
    kwargs = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths),
                  max_seqlen_k=max(lengths))
    document_id = torch.repeat_interleave(
        torch.arange(len(lengths), device=q.device),
        torch.tensor(lengths, device=q.device))

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (document_id[q_idx] == document_id[kv_idx])

    return packed, kwargs, mask_mod, lengths


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="flashjit attention variants vs torch.compile'd FlexAttention and torch SDPA "
        "(same process, forward, d128 bf16); see the module docstring.")
    parser.add_argument("--out-dir", default=".", help="where variants.md and .json go")
    parser.add_argument("--seqlens", default="8192,16384", help="comma-separated N (default "
                        "8192,16384; B = 16384 / N, H = 16)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help="comma-separated subset of " + ",".join(CASES))
    parser.add_argument("--reps", type=int, default=30, help="timed calls per measurement")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls first")
    parser.add_argument("--quick", action="store_true", help="N = 8192 only, 10 reps")
    parser.add_argument("--no-sdpa", action="store_true", help="skip torch SDPA")
    parser.add_argument("--try-configs", default="",
                        help="comma-separated config names also timed for every case (those the "
                        "case's problem accepts): the fastest is reported beside the default, "
                        "what a tuned choice of them would give")
    parser.add_argument("--backward", action="store_true",
                        help="also the backward: flashjit's attention_backward vs autograd through "
                        "the compiled flex_attention (bench/variants_bwd.py)")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: list the cases and check each against FlexAttention (eager, "
                        "CPU) at a tiny size on flashjit's CPU backend")
    args = parser.parse_args(argv)
    args.seqlens = [8192] if args.quick else [int(n) for n in args.seqlens.split(",")]
    if args.quick:
        args.reps = min(args.reps, 10)
    args.cases = args.cases.split(",")
    args.try_configs = [c for c in args.try_configs.split(",") if c]
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    return args


def visible_pairs(case, n, batch=1):
    """(query, key) pairs a case computes per batch entry, exactly (causal: n (n + 1) / 2;
    documents-varlen: its documents' over all batch x n tokens, / batch)."""
    causal = n * (n + 1) // 2
    if case == "documents-varlen":
        return sum(length * (length + 1) // 2 for length in document_lengths(batch * n)) / batch
    if case == "window1024":  # row i sees keys max(0, i - W) .. i
        w = WINDOW
        return sum(min(i, w) + 1 for i in range(n)) if n < 1 << 20 else causal
    if case == "documents2048":
        d = min(DOCUMENT, n)
        return (n // d) * d * (d + 1) // 2 + (n % d) * (n % d + 1) // 2
    if case == "documents-random":
        return sum(length * (length + 1) // 2 for length in random_documents(n))
    return causal


def alibi_slopes_list(heads):
    return [2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)]


def flashjit_kwargs(case, n, slopes):
    """flashjit.attention's variant arguments for a case (causal=True always)."""
    return {
        "causal": {},
        "causal-variant": dict(window=(n, 0)),
        "window1024": dict(window=(WINDOW, 0)),
        "documents2048": dict(mask_mod=f"(q_idx / {DOCUMENT}) == (kv_idx / {DOCUMENT})"),
        "documents-random": dict(mask_mod=random_documents_mask_mod(n)),
        "documents-varlen": {},  # varlen_inputs' arguments, with packed q, k, v
        "softcap50": dict(softcap=SOFTCAP),
        "alibi": dict(alibi_slopes=slopes),
    }[case]


def flex_mods(case, slopes, n=None):
    """(score_mod, mask_mod) of FlexAttention for a case (causal included in the mask; n: the
    sequence length, for documents-random)."""
    import torch

    if case == "documents-random":
        document_id = random_documents_ids(n, slopes.device)

        def random_documents_mask(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (document_id[q_idx] == document_id[kv_idx])

        return None, random_documents_mask

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)

    def documents(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((q_idx // DOCUMENT) == (kv_idx // DOCUMENT))

    def softcap(score, b, h, q_idx, kv_idx):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    return {
        "causal": (None, causal),
        "causal-variant": (None, causal),
        "window1024": (None, window),
        "documents2048": (None, documents),
        "documents-varlen": (None, None),  # varlen_inputs' mask_mod
        "softcap50": (softcap, causal),
        "alibi": (alibi, causal),
    }[case]


def sdpa_mask(case, n, heads, slopes, device):
    """(attn_mask, is_causal) for torch SDPA, or None where SDPA cannot express the case."""
    import torch

    if case in ("causal", "causal-variant"):
        return None, True
    if case == "documents-varlen":
        return None
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    if case == "window1024":
        return (i >= j) & (i - j <= WINDOW), False
    if case == "documents2048":
        return (i >= j) & ((i // DOCUMENT) == (j // DOCUMENT)), False
    if case == "documents-random":
        ids = random_documents_ids(n, device)
        return (i >= j) & (ids[:, None] == ids[None, :]), False
    if case == "alibi":
        bias = slopes[:, None, None] * (j - i)[None].float()  # (H, N, N)
        bias = bias.masked_fill(~(i >= j)[None], float("-inf"))
        return bias.to(torch.bfloat16)[None], False
    return None  # softcap: no SDPA form


def time_ms(fn, reps, warmup):
    """Median of `reps` calls (CUDA events around each), after `warmup` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def relative_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / max(b.norm(), 1e-30))


def plain_renders_plain(flashjit, torch, device):
    """True when window=(-1, -1) is the plain problem (same problem text: same kernel source)."""
    q = torch.zeros(1, 16, 64, 128, device=device, dtype=torch.bfloat16)
    plain = flashjit.config_for(q, q, q, causal=True, layout="bhsd")
    unbounded = flashjit.config_for(q, q, q, causal=True, layout="bhsd", window=(-1, -1))
    return plain["problem"] == unbounded["problem"] and plain["config"] == unbounded["config"]


def time_listed_configs(flashjit, args, case, call, expected):
    """(name, ms) of the fastest of --try-configs for this case, each checked against the default
    config's output first (a config the problem refuses is skipped); None when none ran.
    call(config): flashjit on the case's inputs (plain or packed documents) with that config."""
    best = None
    for name in args.try_configs:
        try:
            def run():
                return call(name)

            error = relative_l2(run(), expected)
            if not error < 1e-2:
                print(f"# {case} {name}: differs from the default config ({error:.2e})")
                continue
            ms = time_ms(run, args.reps, args.warmup)
        except flashjit.Error as refused:
            print(f"# {case} {name}: {type(refused).__name__}: {str(refused)[:160]}")
            continue
        print(f"# {case} {name}: {ms:.4f} ms", flush=True)
        if best is None or ms < best[1]:
            best = (name, ms)
    return best


def dry_run(args):
    """The cases at a tiny size on the CPU: flashjit's CPU backend against eager FlexAttention
    (its reference path), which checks that both sides express the same variant."""
    import torch
    import flashjit
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n, heads, d = 4096 // 16, 2, 64  # scaled down: window and documents as below
    global WINDOW, DOCUMENT, DOC_MIN, DOC_MAX
    WINDOW, DOCUMENT, DOC_MIN, DOC_MAX = 37, 64, 1, 80
    print(f"# dry run on the CPU: N={n} H={heads} d={d}, window {WINDOW}, documents {DOCUMENT}")
    print(f"# window=(-1, -1) is plain attention (same problem, same source): "
          f"{plain_renders_plain(flashjit, torch, 'cpu')}")
    generator = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(1, heads, n, d, generator=generator) for _ in range(3))
    slopes = torch.tensor(alibi_slopes_list(heads))
    worst = 0.0
    for case in args.cases:
        score_mod, mask_mod = flex_mods(case, slopes, n)
        if case == "documents-varlen":
            (pq, pk, pv), kwargs, mask_mod, _ = varlen_inputs(q, k, v)
            block_mask = create_block_mask(mask_mod, None, None, n, n, device="cpu")
            theirs = flex_attention(q, k, v, block_mask=block_mask)
            mine = flashjit.attention(pq, pk, pv, causal=True, **kwargs).transpose(0, 1)[None]
        else:
            block_mask = create_block_mask(mask_mod, None, None, n, n, device="cpu")
            theirs = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
            mine = flashjit.attention(q, k, v, causal=True, layout="bhsd",
                                      **flashjit_kwargs(case, n, slopes))
        error = relative_l2(mine, theirs)
        worst = max(worst, error)
        print(f"{case:16s} pairs {int(visible_pairs(case, n)):9d}  |flashjit - flex| / |flex| = "
              f"{error:.2e}")
        if args.backward:  # the backward's plumbing, each side called once (no timing)
            # FlexAttention has no CPU backward: autograd through the same mods, densely.
            def dense(q, k, v, score_mod=None, block_mask=None, mask_mod=mask_mod):
                idx = torch.arange(q.shape[2])
                heads_ = torch.arange(q.shape[1])[:, None, None]
                s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
                if score_mod is not None:
                    s = score_mod(s, 0, heads_, idx[:, None], idx[None, :])
                visible = mask_mod(0, heads_, idx[:, None], idx[None, :])
                return torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1) @ v

            varlen = ((pq, pk, pv), kwargs) if case == "documents-varlen" else None
            once = lambda fn, reps, warmup: (fn(), 1.0)[1]
            row = case_backward(torch, flashjit, dense, args, q, k, v,
                                flashjit_kwargs(case, n, slopes), score_mod, block_mask, varlen,
                                time_ms=once)
            worst = max(worst, row["bwd_grad_rel_l2_vs_flex"])
            print(f"{'':16s} backward: max over dq, dk, dv of |flashjit - ref| / |ref| = "
                  f"{row['bwd_grad_rel_l2_vs_flex']:.2e} (ref: autograd of the mods, dense)")
    if worst > 1e-3:
        sys.exit(f"variants_bench.py --dry-run: flashjit and FlexAttention differ ({worst:.2e})")


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    import torch
    import torch._dynamo
    import flashjit
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if not torch.cuda.is_available():
        sys.exit("variants_bench.py: no CUDA device (use --dry-run to check the cases on the CPU)")
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    header = dict(device=props.name, torch=torch.__version__, flashjit=flashjit.__version__,
                  commit=os.environ.get("COMMIT", "unknown"), reps=args.reps,
                  dtype="bf16", head_dim=HEAD_DIM, window=WINDOW, document=DOCUMENT,
                  softcap=SOFTCAP,
                  plain_window_is_plain=plain_renders_plain(flashjit, torch, device))
    print("# " + json.dumps(header), flush=True)
    # One compiled FlexAttention per (case, N): more than dynamo's default recompile limit (8),
    # past which it would silently run flex_attention eagerly (materializing the scores).
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    heads = HIDDEN // HEAD_DIM
    for n in args.seqlens:
        batch = max(1, TOKENS // n)
        q, k, v = (torch.randn(batch, heads, n, HEAD_DIM, device=device, dtype=torch.bfloat16)
                   for _ in range(3))
        slopes = torch.tensor(alibi_slopes_list(heads), device=device)
        for case in args.cases:
            row = dict(case=case, N=n, B=batch, H=heads, d=HEAD_DIM)
            flops = 4.0 * batch * heads * HEAD_DIM * visible_pairs(case, n, batch)
            try:
                kwargs = flashjit_kwargs(case, n, slopes)
                varlen = case == "documents-varlen"
                if varlen:  # one packed sequence of every token: (1, H, B N, d) for Flex
                    packed, varlen_kwargs, varlen_mask, lengths = varlen_inputs(q, k, v)
                    row["documents"] = len(lengths)
                    chosen = flashjit.config_for(*packed, causal=True, **varlen_kwargs)
                else:
                    chosen = flashjit.config_for(q, k, v, causal=True, layout="bhsd", **kwargs)
                row["flashjit_config"] = chosen["config"]
                if kwargs.get("mask_mod") and hasattr(flashjit, "block_mask_stats"):
                    # The mask_mod's block map (issue 31): the default kernel's tile, its
                    # build's own device time (once per shape; the timed calls reuse it) and
                    # the shares of its tiles that are empty / partial / full.
                    stats = flashjit.block_mask_stats(q, k, v, causal=True, layout="bhsd",
                                                      mask_mod=kwargs["mask_mod"])
                    if stats:
                        row["block_map_ms"] = round(stats["build_ms"], 4)
                        row["block_map_tiles"] = {
                            key: round(stats[key], 4) for key in ("empty", "partial", "full")}
                with torch.no_grad():
                    def mine(config=None):
                        if varlen:
                            return flashjit.attention(*packed, causal=True, config=config,
                                                      **varlen_kwargs)
                        return flashjit.attention(q, k, v, causal=True, layout="bhsd",
                                                  config=config, **kwargs)

                    started = time.time()
                    out = mine()
                    torch.cuda.synchronize()
                    row["flashjit_first_call_s"] = round(time.time() - started, 2)
                    row["flashjit_ms"] = time_ms(mine, args.reps, args.warmup)
                    if case == "causal-variant":
                        # The machinery's cost: plain causal at the variant's own config (the
                        # plain default may be of a family variants do not run in, e.g. -ws).
                        row["plain_same_config_ms"] = round(time_ms(
                            lambda: flashjit.attention(q, k, v, causal=True, layout="bhsd",
                                                       config=chosen["config"]),
                            args.reps, args.warmup), 4)

                    best = time_listed_configs(flashjit, args, case, mine, out)
                    if best:
                        row["best_listed_config"], row["best_listed_ms"] = best

                    score_mod, mask_mod = flex_mods(case, slopes, n)
                    flex_qkv, flex_n = (q, k, v), n
                    if varlen:
                        mask_mod, flex_n = varlen_mask, batch * n
                        flex_qkv = tuple(x.transpose(0, 1)[None] for x in packed)
                        out = out.transpose(0, 1)[None]
                    block_mask = create_block_mask(mask_mod, None, None, flex_n, flex_n,
                                                   device=device)
                    row["flex_block_sparsity"] = round(float(block_mask.sparsity()), 1)

                    def theirs():
                        return flex(*flex_qkv, score_mod=score_mod, block_mask=block_mask)

                    reference = theirs()
                    row["flex_ms"] = time_ms(theirs, args.reps, args.warmup)
                    row["flashjit_vs_flex_rel_l2"] = float(f"{relative_l2(out, reference):.2e}")
                    del out, reference
                if args.backward:
                    try:
                        row.update(case_backward(torch, flashjit, flex, args, q, k, v, kwargs,
                                                 score_mod, block_mask,
                                                 (packed, varlen_kwargs) if varlen else None))
                        row["flashjit_bwd_tflops"] = round(2.5 * flops / row["flashjit_bwd_ms"] / 1e9, 1)
                        row["flex_bwd_tflops"] = round(2.5 * flops / row["flex_bwd_ms"] / 1e9, 1)
                    except Exception as error:  # the forward's row stands
                        row["bwd_error"] = f"{type(error).__name__}: {str(error)[:300]}"
                with torch.no_grad():
                    mask = None if args.no_sdpa else sdpa_mask(case, n, heads, slopes, device)
                    if mask is not None:
                        attn_mask, is_causal = mask
                        row["sdpa_ms"] = time_ms(
                            lambda: torch.nn.functional.scaled_dot_product_attention(
                                q, k, v, attn_mask=attn_mask, is_causal=is_causal),
                            args.reps, args.warmup)
                        del attn_mask
                for who in ("flashjit", "flex", "sdpa"):
                    if f"{who}_ms" in row:
                        row[f"{who}_ms"] = round(row[f"{who}_ms"], 4)
                        row[f"{who}_tflops"] = round(flops / row[f"{who}_ms"] / 1e9, 1)
                row["speedup_vs_flex"] = round(row["flex_ms"] / row["flashjit_ms"], 3)
                if "best_listed_ms" in row:
                    row["best_listed_ms"] = round(row["best_listed_ms"], 4)
                    row["best_listed_vs_flex"] = round(row["flex_ms"] / row["best_listed_ms"], 3)
                if "sdpa_ms" in row:
                    row["speedup_vs_sdpa"] = round(row["sdpa_ms"] / row["flashjit_ms"], 3)
            except Exception as error:  # report and go on with the other cases
                row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
        del q, k, v
    # The no-cost check: the variant kernel computing causal attention against the plain causal
    # kernel of the same config.
    for r in rows:
        if r.get("plain_same_config_ms"):
            r["variant_cost_vs_plain"] = round(r["flashjit_ms"] / r["plain_same_config_ms"], 3)
    write_outputs(args.out_dir, header, rows)


def case_backward(torch, flashjit, flex, args, q, k, v, kwargs, score_mod, block_mask, varlen,
                  time_ms=time_ms):
    """bench/variants_bwd.py's backward_row for one case: flashjit's forward and backward calls on
    the case's inputs (plain: BHSD q, k, v; varlen: the packed ones), Flex's on leaf copies."""
    if varlen:
        (packed, varlen_kwargs) = varlen
        forward = lambda: flashjit.attention(*packed, causal=True, return_lse=True, **varlen_kwargs)
        backward = lambda o, lse, do: flashjit.attention_backward(*packed, o, lse, do, causal=True,
                                                                  **varlen_kwargs)
        to_flex = lambda x: x.transpose(0, 1)[None]
        flex_inputs = [to_flex(x) for x in packed]
    else:
        forward = lambda: flashjit.attention(q, k, v, causal=True, layout="bhsd", return_lse=True,
                                             **kwargs)
        backward = lambda o, lse, do: flashjit.attention_backward(q, k, v, o, lse, do, causal=True,
                                                                  layout="bhsd", **kwargs)
        to_flex = lambda x: x
        flex_inputs = [q, k, v]

    def flex_forward():
        leaves = [x.detach().clone().requires_grad_(True) for x in flex_inputs]
        return leaves, flex(*leaves, score_mod=score_mod, block_mask=block_mask)

    return backward_row(torch, flashjit, time_ms, args, forward, flex_forward, backward, to_flex)


def write_outputs(out_dir, header, rows):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "variants.json"), "w") as f:
        json.dump(dict(header=header, rows=rows), f, indent=1)
    lines = [
        f"# Attention variants: flashjit vs FlexAttention (torch.compile) and torch SDPA",
        "",
        f"{header['device']}, torch {header['torch']}, commit {header['commit']}, d "
        f"{header['head_dim']} bf16, causal, forward, median of {header['reps']} calls, same "
        f"process. TFLOP/s count the visible pairs. speedup = other's ms / flashjit's ms.",
        f"documents{DOCUMENT}: equal-length documents of {DOCUMENT} tokens as the mask_mod "
        f"`(q_idx / {DOCUMENT}) == (kv_idx / {DOCUMENT})` + causal. documents-varlen: random "
        f"document lengths in [{DOC_MIN}, {DOC_MAX}] over all B x N tokens, flashjit's cu_seqlens "
        f"vs Flex's document_id mask_mod. "
        f"causal-variant: window=(N, 0), the variant kernel computing plain causal attention, "
        f"its cost = its time / plain causal's at the same config; window=(-1, -1) is the plain "
        f"problem and source: {'yes' if header['plain_window_is_plain'] else 'NO'}. "
        f"best listed: the fastest of --try-configs (checked against the default's output), "
        f"what a tuned choice among them gives; flashjit ms is the default config's.",
        "",
        "| case | N | BxH | flashjit ms | TFLOP/s | config | Flex ms | TFLOP/s | vs Flex | "
        "SDPA ms | vs SDPA | rel L2 vs Flex | best listed | ms | vs Flex |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['N']} | {r['B']}x{r['H']} | error: "
                         f"{r['error'][:120]} ||||||||||||")
            continue
        cost = r.get("variant_cost_vs_plain")
        lines.append(
            f"| {r['case']}{f' ({cost:.3f}x plain, same config)' if cost else ''} | {r['N']} | "
            f"{r['B']}x{r['H']} | {r['flashjit_ms']:.3f} | {r['flashjit_tflops']} | "
            f"{r['flashjit_config']} | {r['flex_ms']:.3f} | {r['flex_tflops']} | "
            f"**{r['speedup_vs_flex']:.2f}x** | {r.get('sdpa_ms', '-')} | "
            f"{r.get('speedup_vs_sdpa', '-')} | {r['flashjit_vs_flex_rel_l2']} | "
            f"{r.get('best_listed_config', '-')} | {r.get('best_listed_ms', '-')} | "
            f"{r.get('best_listed_vs_flex', '-')} |")
    maps = [r for r in rows if "block_map_ms" in r]
    if maps:  # the mask_mod cases' block maps (issue 31), apart from the kernels' times
        lines += ["", "Block maps of the mask_mod cases (built once per shape, then reused; "
                  "Flex's create_block_mask is outside its timed loop too):", "",
                  "| case | N | map build ms | empty | partial | full | Flex sparsity % |",
                  "|---|---|---|---|---|---|---|"]
        for r in maps:
            t = r["block_map_tiles"]
            lines.append(f"| {r['case']} | {r['N']} | {r['block_map_ms']:.3f} | "
                         f"{100 * t['empty']:.1f}% | {100 * t['partial']:.1f}% | "
                         f"{100 * t['full']:.1f}% | {r.get('flex_block_sparsity', '-')} |")
    lines += backward_table(rows)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "variants.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
