"""Plain kernels unchanged by a template change (issue 31's check): renders plain configs (mma,
wgmma, -ws; forward and backward) with two flashjit CLIs (`flashjit show`), compiles each source
with NVRTC (no GPU needed) and compares the CUBINs byte for byte. Exit 1 if any differs.

    python3 scripts/plain_cubin_check.py OLD/flashjit NEW/flashjit

(The sources themselves differ wherever a template's text changed, in its #ifdef FLASHJIT_VARIANT
branches too; `flashjit --version`'s plain row versions hash what plain kernels compile from.)"""
import ctypes, subprocess, sys
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
    return buf.raw
old_cli, new_cli = sys.argv[1], sys.argv[2]
cases = [
  ("sm_80", "80", "m64n64w8s2", "--causal --pass bwd", "128"), ("sm_80", "80", "m128n32w8s2-det", "--pass bwd", "64"),
  ("sm_90", "90a", "m64n64w4s2-wgmma-det", "--causal --pass bwd", "128"), ("sm_90", "90a", "m64n128w8s2-wgmma", "--pass bwd", "128"),
  ("sm_80", "80", "m128n64w4s2", "--causal", "128"), ("sm_80", "80", "m64n64w4s2", "", "64"),
  ("sm_90", "90a", "m128n128w8s2-wgmma", "--causal", "128"),
  ("sm_90", "90a", "m128n128w12s2-ws", "--causal", "128"),
  ("sm_90", "90a", "m128n128w12s2-ws", "", "64"),
]
ok = True
for arch, cubin_arch, config, causal, d in cases:
    texts = []
    for cli in (old_cli, new_cli):
        cmd = [cli, "show", "--config", config, "--arch", arch, "--head-dim", d] + (causal.split() if causal else [])
        texts.append(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    a, b = cubin(texts[0], cubin_arch), cubin(texts[1], cubin_arch)
    same = a == b
    ok &= same
    print(f"{config} d{d} {causal or 'non-causal'} sm_{cubin_arch}: source {'same' if texts[0]==texts[1] else 'differs'}, cubin {len(a)} B {'IDENTICAL' if same else 'DIFFERS'}")
sys.exit(0 if ok else 1)
