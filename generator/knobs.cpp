// The device-limit checks of generator/knobs.hpp, out of line: inlined into each budget, gcc 12
// warns falsely (-Wrestrict, PR 105329) on the config name's concatenation.
#include "generator/knobs.hpp"

namespace flashjit::knobs {

Status check_threads(const AttentionConfig& config, int threads, const DeviceSpec& device,
                     const char* per, const std::string& kernel) {
  if (threads <= device.max_threads_per_block) return ok_status();
  return illegal(config, kernel + std::to_string(threads) + " threads exceed the device's " +
                             std::to_string(device.max_threads_per_block) + " per " + per);
}

Status check_memory(const AttentionConfig& config, const std::string& memory, int bytes,
                    const DeviceSpec& device, const char* per) {
  if (bytes <= device.smem_per_block_optin) return ok_status();
  return illegal(config, memory + " " + std::to_string(bytes) + " B exceeds the device's " +
                             std::to_string(device.smem_per_block_optin) + " B per " + per);
}

Status check_registers(const AttentionConfig& config, int regs, int threads,
                       const DeviceSpec& device, const std::string& kernel) {
  if (regs > device.max_regs_per_thread)
    return illegal(config, kernel + "estimated " + std::to_string(regs) +
                               " registers per thread exceed " +
                               std::to_string(device.max_regs_per_thread));
  if (static_cast<long long>(regs) * threads > device.regs_per_sm)
    return illegal(config, kernel + "estimated " + std::to_string(regs * threads) +
                               " registers per CTA exceed the SM's " +
                               std::to_string(device.regs_per_sm));
  return ok_status();
}

}  // namespace flashjit::knobs
