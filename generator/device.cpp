#include "generator/device.hpp"

#include <sstream>

namespace flashjit {

namespace {

// Limits of one representative part per architecture (CUDA C Programming Guide, "Technical
// Specifications per Compute Capability", and the parts' datasheets).
struct NvidiaPart {
  int arch;
  const char* name;
  int sm_count;
  int smem_per_block_optin_kib, smem_per_sm_kib;
  int max_threads_per_sm;
  int l2_mib;
};
// clang-format off
constexpr NvidiaPart kNvidiaParts[] = {
    {80, "sm80 (table: A100)",      108, 163, 164, 2048, 40},  // A100 SXM
    {86, "sm86 (table: RTX A6000)",  84,  99, 100, 1536,  6},
    {89, "sm89 (table: L40S)",      142,  99, 100, 1536, 96},
    {90, "sm90 (table: H100 SXM)",  132, 227, 228, 2048, 50},
};
// clang-format on

DeviceSpec table_entry(int arch) {
  DeviceSpec d;
  d.arch = arch;
  d.regs_per_sm = 65536;
  d.max_regs_per_thread = 255;
  d.max_threads_per_block = 1024;
  for (const NvidiaPart& part : kNvidiaParts) {
    if (part.arch != arch) continue;
    d.name = part.name;
    d.sm_count = part.sm_count;
    d.smem_per_block_optin = part.smem_per_block_optin_kib * 1024;
    d.smem_per_sm = part.smem_per_sm_kib * 1024;
    d.max_threads_per_sm = part.max_threads_per_sm;
    d.l2_bytes = part.l2_mib * 1024 * 1024;
  }
  return d;
}

constexpr int kKnownArchs[] = {80, 86, 89, 90};

// AMD CDNA parts (AMD Instinct datasheets, the CDNA2/CDNA3 ISA guides, and what HIP reports for
// them). Common to both: 64 KiB of LDS per workgroup and per CU, wavefronts of 64 lanes, 4 SIMDs
// per CU with 512 registers per lane each (CDNA2/3 unify 256 VGPRs and 256 AGPRs; one wave may
// use all 512), at most 8 waves per SIMD (2048 threads per CU), 1024 threads per workgroup.
DeviceSpec amd_table_entry(const std::string& processor) {
  DeviceSpec d;
  d.gcn_arch = processor;
  d.warp_size = 64;
  d.smem_per_block_optin = 64 * 1024;
  d.smem_per_sm = 64 * 1024;
  d.regs_per_sm = 512 * 64 * 4;
  d.max_regs_per_thread = 512;
  d.max_threads_per_sm = 2048;
  d.max_threads_per_block = 1024;
  if (processor == "gfx90a") {
    // MI210 and one GCD of an MI250 have 104 CUs; one GCD of an MI250X has 110. The CU count
    // only sizes grids in the tuner: the legal configs are the same on all three.
    d.name = "gfx90a (table: MI210 / MI250 GCD)";
    d.sm_count = 104;
    d.l2_bytes = 8 * 1024 * 1024;
  } else if (processor == "gfx942") {
    d.name = "gfx942 (table: MI300X)";
    d.sm_count = 304;
    d.l2_bytes = 4 * 1024 * 1024;  // per XCD, as HIP reports it (plus 256 MiB Infinity Cache)
  }
  return d;
}

const char* const kKnownAmdArchs[] = {"gfx90a", "gfx942"};

}  // namespace

std::string DeviceSpec::arch_name() const {
  if (is_amd()) return gcn_processor(gcn_arch);
  return arch == 0 ? "cpu" : "sm" + std::to_string(arch);
}

std::string DeviceSpec::to_string() const {
  std::ostringstream out;
  if (is_amd()) {
    out << name << ": " << gcn_arch << ", " << sm_count << " CUs, wave" << warp_size << ", LDS "
        << smem_per_block_optin << " B/workgroup, " << smem_per_sm << " B/CU, "
        << max_regs_per_thread << " VGPRs+AGPRs/lane, L2 " << l2_bytes / (1024 * 1024) << " MiB";
    return out.str();
  }
  out << name << ": sm_" << arch << ", " << sm_count << " SMs, smem " << smem_per_block_optin
      << " B/block (opt-in), " << smem_per_sm << " B/SM, " << regs_per_sm << " regs/SM, L2 "
      << l2_bytes / (1024 * 1024) << " MiB";
  return out.str();
}

std::string gcn_processor(const std::string& target_id) {
  return target_id.substr(0, target_id.find(':'));
}

int gcn_arch_number(const std::string& target_id) {
  const std::string processor = gcn_processor(target_id);
  if (processor.size() < 4 || processor.size() > 8 || processor.rfind("gfx", 0) != 0) return 0;
  int number = 0;
  for (char c : processor.substr(3)) {
    int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return 0;
    number = number * 16 + digit;
  }
  return number;
}

std::vector<std::string> known_archs() {
  std::vector<std::string> names;
  for (int arch : kKnownArchs) names.push_back("sm" + std::to_string(arch));
  for (const char* arch : kKnownAmdArchs) names.emplace_back(arch);
  return names;
}

Result<DeviceSpec> known_device(const std::string& arch) {
  for (const char* amd : kKnownAmdArchs) {
    if (gcn_processor(arch) == amd) {
      DeviceSpec device = amd_table_entry(amd);
      device.gcn_arch = arch;  // keeps feature flags the caller gave ("gfx90a:xnack-")
      return device;
    }
  }
  std::string digits = arch;
  if (digits.rfind("sm_", 0) == 0)
    digits = digits.substr(3);
  else if (digits.rfind("sm", 0) == 0)
    digits = digits.substr(2);
  for (int known : kKnownArchs)
    if (digits == std::to_string(known)) return table_entry(known);
  std::string allowed;
  for (const std::string& name : known_archs()) allowed += (allowed.empty() ? "" : ", ") + name;
  return make_error(ErrorCode::InvalidArgument,
                    "arch = '" + arch + "': not in the device table; known: " + allowed);
}

}  // namespace flashjit
