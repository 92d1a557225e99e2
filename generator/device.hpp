// DeviceSpec: the limits of one GPU that decide which kernel configurations are legal.
// Filled from the driver by the runtime, or from a table of known architectures so that
// planning and compiling work with no GPU present. NVIDIA GPUs, AMD GPUs (gcn_arch set) and the
// host CPU (arch 0, no gcn_arch) share the one struct; the AMD meaning of each field is noted.
#pragma once

#include <string>
#include <vector>

#include "generator/error.hpp"

namespace flashjit {

struct DeviceSpec {
  std::string name;  // "NVIDIA H100 80GB HBM3", or "sm90 (table)"
  int arch = 0;      // NVIDIA: compute capability * 10: 80, 86, 89, 90; 0 on AMD and the CPU
  // AMD: the target ID as HIP reports it ("gfx90a:sramecc+:xnack-", or "gfx90a" from the
  // table); empty on NVIDIA and the CPU.
  std::string gcn_arch;
  int warp_size = 32;             // AMD CDNA: 64 (a wavefront)
  int sm_count = 0;               // AMD: compute units
  int smem_per_block_optin = 0;   // bytes a block may use after opting in; AMD: LDS per workgroup
  int smem_per_sm = 0;            // bytes; AMD: LDS per CU
  int regs_per_sm = 0;            // 32-bit registers; AMD: VGPRs (+ AGPRs) per lane x 64 x 4 SIMDs
  int max_regs_per_thread = 255;  // AMD: per lane, VGPRs + AGPRs (512 on CDNA2/3)
  int max_threads_per_sm = 0;
  int max_threads_per_block = 1024;
  int l2_bytes = 0;

  bool is_amd() const { return !gcn_arch.empty(); }
  // The CPU backend describes the host CPU with arch 0 (and no gcn_arch).
  bool is_cpu() const { return arch == 0 && gcn_arch.empty(); }
  // "sm90"; "gfx90a" (the target ID without its feature flags) on AMD; "cpu" for the host CPU.
  std::string arch_name() const;
  std::string to_string() const;
};

// Architectures the table knows: "sm80", "sm86", "sm89", "sm90" with a representative part's
// limits (A100, RTX A6000, L40S, H100 SXM), then "gfx90a", "gfx942" (MI210 / MI250 GCD, MI300X).
std::vector<std::string> known_archs();
// Accepts "sm80", "sm_80", "80", "gfx90a", "gfx942" (an AMD name may carry feature flags:
// "gfx90a:sramecc+:xnack-"); error lists the known names.
Result<DeviceSpec> known_device(const std::string& arch);

// "gfx90a:sramecc+:xnack-" -> "gfx90a": the processor of an AMD target ID.
std::string gcn_processor(const std::string& target_id);
// The processor's hex digits as a number ("gfx90a" -> 0x90a, "gfx942" -> 0x942), or 0 when the
// name is not gfx<hex digits>. Tuning-DB fingerprints store an AMD arch this way.
int gcn_arch_number(const std::string& target_id);

}  // namespace flashjit
