#include "generator/device.hpp"

#include <sstream>

namespace flashjit {

namespace {

// Limits of one representative part per architecture (CUDA C Programming Guide, "Technical
// Specifications per Compute Capability", and the parts' datasheets).
DeviceSpec table_entry(int arch) {
  DeviceSpec d;
  d.arch = arch;
  d.regs_per_sm = 65536;
  d.max_regs_per_thread = 255;
  d.max_threads_per_block = 1024;
  switch (arch) {
    case 80:  // A100 SXM
      d.name = "sm80 (table: A100)";
      d.sm_count = 108;
      d.smem_per_block_optin = 163 * 1024;
      d.smem_per_sm = 164 * 1024;
      d.max_threads_per_sm = 2048;
      d.l2_bytes = 40 * 1024 * 1024;
      break;
    case 86:  // RTX A6000
      d.name = "sm86 (table: RTX A6000)";
      d.sm_count = 84;
      d.smem_per_block_optin = 99 * 1024;
      d.smem_per_sm = 100 * 1024;
      d.max_threads_per_sm = 1536;
      d.l2_bytes = 6 * 1024 * 1024;
      break;
    case 89:  // L40S
      d.name = "sm89 (table: L40S)";
      d.sm_count = 142;
      d.smem_per_block_optin = 99 * 1024;
      d.smem_per_sm = 100 * 1024;
      d.max_threads_per_sm = 1536;
      d.l2_bytes = 96 * 1024 * 1024;
      break;
    case 90:  // H100 SXM
      d.name = "sm90 (table: H100 SXM)";
      d.sm_count = 132;
      d.smem_per_block_optin = 227 * 1024;
      d.smem_per_sm = 228 * 1024;
      d.max_threads_per_sm = 2048;
      d.l2_bytes = 50 * 1024 * 1024;
      break;
  }
  return d;
}

constexpr int kKnownArchs[] = {80, 86, 89, 90};

}  // namespace

std::string DeviceSpec::to_string() const {
  std::ostringstream out;
  out << name << ": sm_" << arch << ", " << sm_count << " SMs, smem " << smem_per_block_optin
      << " B/block (opt-in), " << smem_per_sm << " B/SM, " << regs_per_sm << " regs/SM, L2 "
      << l2_bytes / (1024 * 1024) << " MiB";
  return out.str();
}

std::vector<std::string> known_archs() {
  std::vector<std::string> names;
  for (int arch : kKnownArchs) names.push_back("sm" + std::to_string(arch));
  return names;
}

Result<DeviceSpec> known_device(const std::string& arch) {
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
