"""Plain kernels unchanged by a template change (issue 31's check): renders plain configs with two
flashjit CLIs (`flashjit show`), compiles each source with NVRTC (no GPU needed) and compares the
CUBINs byte for byte. Exit 1 if any differs.

    python3 scripts/plain_cubin_check.py OLD/flashjit NEW/flashjit [--quick] [--jobs N] [--only S]

The cases cover every forward config family the shipped tuning rows use (data/tuning/*.sql: mma,
-wgmma, -ws, -ws-persist, -ws-pp, -ws-pp-persist) at head dims 64, 128 and 256, causal and not,
bf16 and fp16; the backward defaults and configs (mma, -wgmma, -ws; deterministic too) and the
decode defaults (contiguous and paged). --quick: bf16 only, d 64 and 128. --only S: the cases
whose flags contain S (e.g. --only=-ws).

(The sources themselves differ wherever a template's text changed, in its #ifdef FLASHJIT_VARIANT
branches too; `flashjit --version`'s plain row versions hash what plain kernels compile from.)"""
import ctypes, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

nv = ctypes.CDLL("/usr/local/cuda/lib64/libnvrtc.so")


def cubin(src, arch):
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None) == 0
    opts = [f"--gpu-architecture=sm_{arch}".encode(), b"--std=c++17", b"--fmad=true", b"--no-cache"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
    if rc != 0:
        n = ctypes.c_size_t(); nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value); nv.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(log.value.decode()[:2000])
    n = ctypes.c_size_t(); nv.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value); nv.nvrtcGetCUBIN(prog, buf)
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.raw


flags_with_values = ("--jobs", "--only")
args = [a for i, a in enumerate(sys.argv[1:], 1)
        if not a.startswith("--") and sys.argv[i - 1] not in flags_with_values]
quick = "--quick" in sys.argv
jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 2
if len(args) < 2:
    sys.exit(__doc__)
old_cli, new_cli = args[0], args[1]

# (arch for show, arch for NVRTC, flags). The forward families of the shipped rows, one or two
# configs each that are legal at every head dim listed.
forward = {
    64: ["m128n64w4s2", "m64n32w4s2", "m128n64w8s3", "m128n64w8s2-wgmma", "m64n128w4s3-wgmma",
         "m128n128w12s2-ws", "m192n64w16s3-ws", "m128n64w12s2-ws-persist", "m128n64w12s2-ws-pp",
         "m128n128w12s2-ws-pp-persist"],
    128: ["m128n64w4s2", "m64n32w4s2", "m128n64w8s3", "m128n64w8s2-wgmma", "m64n128w4s3-wgmma",
          "m128n128w12s2-ws", "m192n64w16s3-ws", "m128n64w12s2-ws-persist", "m128n64w12s2-ws-pp",
          "m128n128w12s2-ws-pp-persist"],
    256: ["m128n32w8s2", "m64n32w4s3", "m128n64w8s2-wgmma", "m64n64w8s3-ws",
          "m128n64w12s2-ws-persist", "m128n64w12s2-ws-pp", "m128n64w12s2-ws-pp-persist"],
}
cases = []
for d in (64, 128) if quick else (64, 128, 256):
    for dtype in ("bf16",) if quick else ("bf16", "fp16"):
        for causal in ("", "--causal"):
            for config in forward[d]:
                sm90 = "wgmma" in config or "-ws" in config
                cases.append(("sm90" if sm90 else "sm80", "90a" if sm90 else "80",
                              f"--config {config} --head-dim {d} --dtype {dtype} {causal}"))
# The backward: defaults and the families' configs; the decode defaults.
for arch, cubin_arch in (("sm80", "80"), ("sm90", "90a")):
    for causal in ("", "--causal"):
        cases.append((arch, cubin_arch, f"--pass bwd --head-dim 128 {causal}"))
        cases.append((arch, cubin_arch, f"--pass bwd --head-dim 64 --deterministic {causal}"))
        cases.append((arch, cubin_arch, f"--seqlen-q 1 --seqlen-k 4096 --head-dim 128 {causal}"))
        cases.append((arch, cubin_arch,
                      f"--seqlen-q 1 --seqlen-k 4096 --head-dim 64 --page-size 64 --dtype fp16 {causal}"))
cases += [
    ("sm80", "80", "--config m64n64w8s2 --causal --pass bwd --head-dim 128"),
    ("sm80", "80", "--config m128n32w8s2-det --pass bwd --head-dim 64"),
    ("sm90", "90a", "--config m64n64w4s2-wgmma-det --causal --pass bwd --head-dim 128"),
    ("sm90", "90a", "--config m64n128w8s2-wgmma --pass bwd --head-dim 128"),
    ("sm90", "90a", "--config m64n128w12s2-ws --pass bwd --head-dim 128 --causal"),
]
if "--only" in sys.argv:
    only = sys.argv[sys.argv.index("--only") + 1]
    cases = [c for c in cases if only in c[2] or only in c[0]]


def check(case):
    arch, cubin_arch, flags = case
    texts = []
    for cli in (old_cli, new_cli):
        cmd = [cli, "show", "--arch", arch] + flags.split()
        texts.append(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    a, b = cubin(texts[0], cubin_arch), cubin(texts[1], cubin_arch)
    return (a == b, f"{' '.join(flags.split())} sm_{cubin_arch}: source "
            f"{'same' if texts[0] == texts[1] else 'differs'}, cubin {len(a)} B "
            f"{'IDENTICAL' if a == b else 'DIFFERS'}")


ok = True
count = 0
with ThreadPoolExecutor(max_workers=jobs) as pool:
    for same, line in pool.map(check, cases):
        ok &= same
        count += same
        print(line, flush=True)
print(f"{count} of {len(cases)} identical")
sys.exit(0 if ok else 1)
