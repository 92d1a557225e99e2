// The host CPU as the CPU backend plans for it: model, cores, cache sizes, ISA features.
// Needs no LLVM, so planning for the CPU works in every build.
#pragma once

#include <string>

#include "generator/cpu_config.hpp"

namespace flashjit::cpu {

// Reads /proc/cpuinfo (model name, flags), /sys/devices/system/cpu/cpu0/cache/index*/ (level,
// type, size) and std::thread::hardware_concurrency(). A value that cannot be read keeps
// known_cpu()'s (the model then says "(unknown)"); never fails.
CpuSpec host_cpu();

// Parses a sysfs cache size ("48K", "1024K", "32M", "123"): bytes, 0 when malformed.
long long parse_cache_size(const std::string& text);

}  // namespace flashjit::cpu
