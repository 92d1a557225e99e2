#include "generator/device.hpp"

#include <gtest/gtest.h>

namespace flashjit {
namespace {

TEST(Device, TableKnowsTheSupportedArchitectures) {
  for (const std::string& arch : known_archs()) {
    auto device = known_device(arch);
    ASSERT_TRUE(device.ok()) << arch;
    EXPECT_EQ(device->arch_name(), arch);
    EXPECT_FALSE(device->is_cpu()) << arch;
    EXPECT_GT(device->sm_count, 0);
    EXPECT_GE(device->smem_per_sm, device->smem_per_block_optin);
    if (device->is_amd()) {
      EXPECT_EQ(device->smem_per_block_optin, 64 * 1024);  // LDS per workgroup on CDNA2/3
      EXPECT_EQ(device->warp_size, 64);
      EXPECT_EQ(device->max_regs_per_thread, 512);
      EXPECT_EQ(device->regs_per_sm, 512 * 64 * 4);
    } else {
      EXPECT_GE(device->smem_per_block_optin, 99 * 1024);
      EXPECT_EQ(device->warp_size, 32);
      EXPECT_EQ(device->regs_per_sm, 65536);
    }
  }
  EXPECT_EQ(known_device("sm_90")->smem_per_block_optin, 227 * 1024);
  EXPECT_EQ(known_device("80")->arch, 80);
}

TEST(Device, AmdEntries) {
  auto mi200 = known_device("gfx90a");
  ASSERT_TRUE(mi200.ok());
  EXPECT_TRUE(mi200->is_amd());
  EXPECT_EQ(mi200->arch, 0);
  EXPECT_EQ(mi200->sm_count, 104);
  auto mi300 = known_device("gfx942");
  ASSERT_TRUE(mi300.ok());
  EXPECT_EQ(mi300->sm_count, 304);
  EXPECT_NE(mi300->to_string().find("304 CUs, wave64, LDS 65536 B/workgroup"), std::string::npos)
      << mi300->to_string();
  // A target ID with feature flags keeps them; the arch name is the processor.
  auto flagged = known_device("gfx90a:sramecc+:xnack-");
  ASSERT_TRUE(flagged.ok());
  EXPECT_EQ(flagged->gcn_arch, "gfx90a:sramecc+:xnack-");
  EXPECT_EQ(flagged->arch_name(), "gfx90a");
  EXPECT_FALSE(known_device("gfx908").ok());
  EXPECT_FALSE(known_device("gfx9").ok());
  // The CPU backend's spec (arch 0, no gcn_arch) is the CPU.
  DeviceSpec cpu;
  EXPECT_TRUE(cpu.is_cpu());
  EXPECT_EQ(cpu.arch_name(), "cpu");
}

TEST(Device, UnknownArchNamesTheKnownOnes) {
  auto device = known_device("sm75");
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(device.error().message.find("sm75"), std::string::npos);
  EXPECT_NE(device.error().message.find("sm90"), std::string::npos);
  EXPECT_NE(device.error().message.find("gfx942"), std::string::npos);
}

}  // namespace
}  // namespace flashjit
