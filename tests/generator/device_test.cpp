#include "generator/device.hpp"

#include <gtest/gtest.h>

namespace flashjit {
namespace {

TEST(Device, TableKnowsTheSupportedArchitectures) {
  for (const std::string& arch : known_archs()) {
    auto device = known_device(arch);
    ASSERT_TRUE(device.ok()) << arch;
    EXPECT_EQ(device->arch_name(), arch);
    EXPECT_GT(device->sm_count, 0);
    EXPECT_GE(device->smem_per_block_optin, 99 * 1024);
    EXPECT_GE(device->smem_per_sm, device->smem_per_block_optin);
    EXPECT_EQ(device->regs_per_sm, 65536);
  }
  EXPECT_EQ(known_device("sm_90")->smem_per_block_optin, 227 * 1024);
  EXPECT_EQ(known_device("80")->arch, 80);
}

TEST(Device, UnknownArchNamesTheKnownOnes) {
  auto device = known_device("sm75");
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(device.error().message.find("sm75"), std::string::npos);
  EXPECT_NE(device.error().message.find("sm90"), std::string::npos);
}

}  // namespace
}  // namespace flashjit
