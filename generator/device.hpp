// DeviceSpec: the limits of one GPU that decide which kernel configurations are legal.
// Filled from the driver by the runtime, or from a table of known architectures so that
// planning and compiling work with no GPU present.
#pragma once

#include <string>
#include <vector>

#include "generator/error.hpp"

namespace flashjit {

struct DeviceSpec {
  std::string name;  // "NVIDIA H100 80GB HBM3", or "sm90 (table)"
  int arch = 0;      // compute capability * 10: 80, 86, 89, 90
  int sm_count = 0;
  int smem_per_block_optin = 0;  // bytes a block may use after opting in
  int smem_per_sm = 0;           // bytes
  int regs_per_sm = 0;           // 32-bit registers
  int max_regs_per_thread = 255;
  int max_threads_per_sm = 0;
  int max_threads_per_block = 1024;
  int l2_bytes = 0;

  // "sm90"; "cpu" for the host CPU, which the CPU backend describes with arch 0.
  std::string arch_name() const { return arch == 0 ? "cpu" : "sm" + std::to_string(arch); }
  std::string to_string() const;
};

// Architectures the table knows ("sm80", "sm86", "sm89", "sm90"), with a representative part's
// limits (A100, RTX A6000, L40S, H100 SXM).
std::vector<std::string> known_archs();
// Accepts "sm80", "sm_80", "80"; error lists the known names.
Result<DeviceSpec> known_device(const std::string& arch);

}  // namespace flashjit
