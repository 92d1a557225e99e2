"""Side-by-side peer attention timings on a GPU (PyTorch SDPA backends).
Run on a GPU machine: python3 peers_bench.py [--quick] [--bf16] [--fwd-only]
                      [--backends flash,cudnn,efficient] [--json PATH]
Prints one line per (backend, dtype, hdim, causal, seqlen): fwd and fwd+bwd TFLOP/s.
FLOP convention (FlashAttention's): fwd = 4*B*H*N*N*d, /2 when causal; bwd = 2.5 * fwd.
--fwd-only skips the fwd+bwd timing (saves device time; fwd is timed the same way); --backends picks SDPA backends.
Copied from the project's shared/peers/peers_bench.py (the GPU machine does not receive shared/).
"""
import sys, json, os, torch, triton
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F


def arg_value(flag, default=None):
    if flag not in sys.argv:
        return default
    i = sys.argv.index(flag)
    if i + 1 >= len(sys.argv):
        sys.exit(f"peers_bench.py: {flag} needs a value")
    return sys.argv[i + 1]


quick = "--quick" in sys.argv
fwd_only = "--fwd-only" in sys.argv
all_backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
chosen = arg_value("--backends", ",".join(all_backends)).split(",")
unknown = [name for name in chosen if name not in all_backends]
if unknown:
    sys.exit(f"peers_bench.py: unknown backend(s) {unknown}; choose from {list(all_backends)}")
backends = {name: all_backends[name] for name in chosen}

dev = torch.cuda.get_device_properties(0)
print(f"# device {dev.name} sms={dev.multi_processor_count} torch={torch.__version__} cudnn={torch.backends.cudnn.version()}")

def bench(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")  # ms

# ceilings
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
ms = bench(lambda: a @ b); print(f"# ceiling bf16 matmul 8192^3: {2*8192**3/ms/1e9:.0f} TFLOP/s")
x = torch.empty(2 * 1024**3 // 2, device="cuda", dtype=torch.bfloat16).normal_(); y = torch.empty_like(x)
ms = bench(lambda: y.copy_(x)); print(f"# ceiling d2d copy: {2*x.numel()*2/ms/1e6:.0f} GB/s")
del a, b, x, y

rows = []
total = 16384
for dtype in ([torch.bfloat16] if (quick or "--bf16" in sys.argv) else [torch.bfloat16, torch.float16]):
  for d in (64, 128, 256):
    H = 2048 // d
    for causal in (False, True):
      for N in ((1024, 4096, 16384) if quick else (512, 1024, 2048, 4096, 8192, 16384)):
        B = max(1, total // N)
        q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        f = 4 * B * H * N * N * d / (2 if causal else 1)
        for name, be in backends.items():
            try:
                with sdpa_kernel([be]):
                    # Forward timed exactly as without --fwd-only (inputs requiring grad, as in
                    # training), so that its numbers stay comparable with earlier full runs.
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                    if not fwd_only:
                        g = torch.randn_like(o)
                        msfb = bench(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v), g))
                r = dict(backend=name, dtype=str(dtype)[6:], d=d, causal=causal, N=N, B=B, H=H,
                         fwd_tflops=round(f / ms / 1e9, 1), fwd_ms=round(ms, 4))
                if not fwd_only:
                    r["fwdbwd_tflops"] = round(3.5 * f / msfb / 1e9, 1)
            except Exception as e:
                r = dict(backend=name, dtype=str(dtype)[6:], d=d, causal=causal, N=N, err=str(e)[:80])
            rows.append(r); print(json.dumps(r), flush=True)
        del q, k, v
if "--json" in sys.argv:  # --json PATH: also write all rows to PATH
    json.dump(rows, open(arg_value("--json"), "w"), indent=1)
