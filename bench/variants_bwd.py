"""The backward half of bench/variants_bench.py (--backward): flashjit's attention_backward
against the backward of torch.compile'd FlexAttention (torch.autograd.grad through it), same
process, same inputs and dO, for each variant case; and the table of it.

flashjit: o and lse from its forward (made before timing), then attention_backward(q, k, v, o,
lse, do) with the case's variant arguments (packed documents: cu_seqlens). Flex: its output
computed once with q, k, v requiring grad, then torch.autograd.grad(out, (q, k, v), do,
retain_graph=True) per call. Both timed by the caller's time_ms (CUDA events around each call,
warm-up first, the median). FLOPs: 2.5x the forward's over the visible pairs (the FlashAttention
convention). The gradients are compared (relative L2 of dq, dk, dv to Flex's, the largest of the
three), which must be small: both are bf16 approximations of the same gradients.
"""


def relative_l2(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def backward_row(torch, flashjit, time_ms, args, mine_call, flex_call, bwd_call, to_flex):
    """Times one case's backward; returns the row's backward fields.

    mine_call(): flashjit's forward (o, lse); bwd_call(o, lse, do): flashjit's backward (dq, dk,
    dv); flex_call(q, k, v): Flex's forward on leaf tensors; to_flex(x): flashjit's layout of a
    q/k/v-shaped tensor as Flex's; the inputs (flex layout) come from flex_call's closure."""
    o, lse = mine_call()
    do = torch.randn_like(o)
    grads = bwd_call(o, lse, do)
    ms = time_ms(lambda: bwd_call(o, lse, do), args.reps, args.warmup)

    leaves, out = flex_call()
    do_flex = to_flex(do)
    flex_grads = torch.autograd.grad(out, leaves, do_flex, retain_graph=True)
    flex_ms = time_ms(lambda: torch.autograd.grad(out, leaves, do_flex, retain_graph=True),
                      args.reps, args.warmup)
    error = max(relative_l2(to_flex(mine), theirs) for mine, theirs in zip(grads, flex_grads))
    return dict(flashjit_bwd_ms=round(ms, 4), flex_bwd_ms=round(flex_ms, 4),
                bwd_speedup_vs_flex=round(flex_ms / ms, 3),
                bwd_grad_rel_l2_vs_flex=float(f"{error:.2e}"))


def backward_table(rows):
    """Markdown lines of the backward rows (TFLOP/s: 2.5x the forward's FLOPs)."""
    lines = ["", "Backward (dq, dk, dv; 2.5x the forward's FLOPs over the visible pairs; Flex: "
             "torch.autograd.grad through the compiled flex_attention; rel L2: the largest of "
             "dq, dk, dv against Flex's):", "",
             "| case | N | BxH | flashjit bwd ms | TFLOP/s | Flex bwd ms | TFLOP/s | vs Flex | "
             "grad rel L2 vs Flex |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "flashjit_bwd_ms" not in r:
            if "bwd_error" in r:
                lines.append(f"| {r['case']} | {r['N']} | {r['B']}x{r['H']} | error: "
                             f"{r['bwd_error'][:120]} ||||||")
            continue
        lines.append(f"| {r['case']} | {r['N']} | {r['B']}x{r['H']} | {r['flashjit_bwd_ms']:.3f} | "
                     f"{r['flashjit_bwd_tflops']} | {r['flex_bwd_ms']:.3f} | "
                     f"{r['flex_bwd_tflops']} | **{r['bwd_speedup_vs_flex']:.2f}x** | "
                     f"{r['bwd_grad_rel_l2_vs_flex']} |")
    return lines
