// The host CPU as the CPU backend plans for it: model, cores, cache sizes, ISA features.
// Needs no LLVM, so planning for the CPU works in every build.
#pragma once

#include <optional>
#include <string>

#include "generator/cpu_config.hpp"
#include "generator/error.hpp"

namespace flashjit::cpu {

// The x86-64 ISA levels of the CPU templates (templates/cpu/common.hpp picks its register tiles
// and conversions from the target's macros), as targets to compile for on any x86-64 host: the
// tests compile every level and run those the host can execute.
//   Sse       "x86-64" (SSE2): 16 xmm, f32x16 in four
//   Avx2      "x86-64-v3": AVX2, FMA, F16C (16 ymm)
//   Avx512    "x86-64-v4": AVX-512 F/BW/DQ/VL (32 zmm)
//   Avx512Bf16  "x86-64-v4" + AVX512_BF16 (vdpbf16ps for bf16 storage)
enum class CpuIsa { Sse, Avx2, Avx512, Avx512Bf16 };
// "sse", "avx2", "avx512", "avx512bf16"
const char* to_string(CpuIsa isa);

// The environment variable FLASHJIT_CPU_ISA caps the ISA level the CPU backend plans and
// compiles for (one of the names above): kernels then run on any host of that level, and a host
// can measure a lower level's kernels (with PyTorch's ATEN_CPU_CAPABILITY, its peer in the same
// run). Read once per process (host_cpu() and the JIT's target agree); parse_isa_cap is the
// parsing: null or empty, no cap (nullopt); error InvalidArgument naming the value and the
// allowed names otherwise.
Result<std::optional<CpuIsa>> isa_cap();
Result<std::optional<CpuIsa>> parse_isa_cap(const char* value);

// `cpu` without the features above `cap` (Sse: no AVX2, FMA, F16C, AVX-512; Avx2: no AVX-512;
// Avx512: no AVX512_BF16).
CpuSpec capped(CpuSpec cpu, CpuIsa cap);

// Reads /proc/cpuinfo (model name, flags), /sys/devices/system/cpu/cpu0/cache/index*/ (level,
// type, size) and std::thread::hardware_concurrency(). A value that cannot be read keeps
// known_cpu()'s (the model then says "(unknown)"); never fails. Under a valid FLASHJIT_CPU_ISA
// cap, the features above it are left out (capped()).
CpuSpec host_cpu();

// Parses a sysfs cache size ("48K", "1024K", "32M", "123"): bytes, 0 when malformed.
long long parse_cache_size(const std::string& text);

}  // namespace flashjit::cpu
