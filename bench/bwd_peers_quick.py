"""torch SDPA's cuDNN (and flash) backward on a few shapes, for a quick same-call comparison with
`flashjit run --pass bwd` (bench/device_run.sh bwd-ws). The full comparison in one process is
bench/side_by_side.py --pass bwd.

    python3 bench/bwd_peers_quick.py B,H,N,D,CAUSAL [B,H,N,D,CAUSAL ...]

Prints per shape and backend: backward ms (median, triton.testing.do_bench: fwd+bwd minus fwd)
and TFLOP/s by FlashAttention's convention (bwd = 2.5 x fwd = 10 B H N^2 d, / 2 when causal).
"""
import sys

import torch
import triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def main():
    shapes = [tuple(int(x) for x in arg.split(",")) for arg in sys.argv[1:]]
    if not shapes:
        sys.exit(__doc__)
    dev = torch.cuda.get_device_properties(0)
    print(f"# device {dev.name} torch={torch.__version__} cudnn={torch.backends.cudnn.version()}")
    for b, h, n, d, causal in shapes:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
        flops_bwd = 10 * b * h * n * n * d / (2 if causal else 1)
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("flash", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel([backend]):
                fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))

                def fwd_bwd():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                    torch.autograd.grad(o, (q, k, v), do)

                both = bench(fwd_bwd)
            bwd = both - fwd
            print(f"{name:6s} B{b} H{h} N{n} d{d} {'causal' if causal else 'non-causal':10s} "
                  f"bwd {bwd:.3f} ms {flops_bwd / bwd / 1e9:.0f} TFLOP/s  (fwd {fwd:.3f} ms)")


if __name__ == "__main__":
    main()
