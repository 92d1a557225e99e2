// The wgmma family's backward budget (generator/backward_config_sm90.hpp): knob space, legality
// (architecture, dtype, determinism, template shapes, shared memory, registers), launch shapes
// and the proposed defaults. The compile test (tests/templates/cuda_compile_test.cpp
// (CudaCompileBackward)) checks that the legal set compiles clean; this one pins the set and the
// arithmetic.
#include "generator/backward_config_sm90.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace flashjit {
namespace {

DeviceSpec sm(int arch) { return *known_device("sm" + std::to_string(arch)); }

AttentionProblem backward(int head_dim, bool causal = false, DType dtype = DType::BF16) {
  return AttentionProblem::make(2, 16, 4, 4096, 4096, head_dim, dtype, causal)
      .with_pass(Pass::Backward);
}

AttentionConfig wgmma(int block_m, int block_n, int warps, int stages, DqMode dq = DqMode::Atomic) {
  return {block_m, block_n, warps, stages, KernelFamily::Wgmma, dq};
}

std::vector<std::string> legal_names(const AttentionProblem& problem, const DeviceSpec& device) {
  std::vector<std::string> names;
  for (const AttentionConfig& c : wgmma_backward_candidates(problem))
    if (check_wgmma_backward_config(c, problem, device).ok()) names.push_back(c.to_string());
  return names;
}

std::string message_of(const Status& status) {
  return status.ok() ? std::string("(ok)") : status.error().message;
}

TEST(WgmmaBackwardConfig, CandidatesAreTheWholeKnobSpace) {
  const std::vector<AttentionConfig> all = wgmma_backward_candidates(backward(128));
  EXPECT_EQ(all.size(), 2u * 2 * 2 * 2 * 2);  // block_m x block_n x warps x stages x dq
  for (const AttentionConfig& c : all) EXPECT_EQ(c.family, KernelFamily::Wgmma);
  AttentionProblem deterministic = backward(128);
  deterministic.deterministic = true;
  const std::vector<AttentionConfig> separate = wgmma_backward_candidates(deterministic);
  EXPECT_EQ(separate.size(), all.size() / 2);
  for (const AttentionConfig& c : separate) EXPECT_EQ(c.dq, DqMode::Separate);
}

// The legal sets on an H100, pinned: a budget change shows here with its reason. The Atomic
// configs stage their dQ tiles in shared memory (rows of 4 x dQ-tile columns + 32 bytes): at d 128
// m128n64w8 no longer fits, at d 256 none does; two shapes at the register edge spill (measured).
TEST(WgmmaBackwardConfig, LegalSetsPerHeadDim) {
  EXPECT_EQ(
      legal_names(backward(64), sm(90)),
      (std::vector<std::string>{
          "m64n64w4s2-wgmma", "m64n64w4s2-wgmma-det", "m64n64w4s3-wgmma", "m64n64w4s3-wgmma-det",
          "m64n128w8s2-wgmma-det", "m64n128w8s3-wgmma-det", "m128n64w4s2-wgmma-det",
          "m128n64w4s3-wgmma-det", "m128n128w8s2-wgmma-det", "m128n128w8s3-wgmma-det"}));
  EXPECT_EQ(legal_names(backward(128, true), sm(90)),
            (std::vector<std::string>{
                "m64n64w4s2-wgmma", "m64n64w4s2-wgmma-det", "m64n64w4s3-wgmma",
                "m64n64w4s3-wgmma-det", "m64n64w8s2-wgmma", "m64n64w8s2-wgmma-det",
                "m64n64w8s3-wgmma", "m64n64w8s3-wgmma-det", "m64n128w8s2-wgmma",
                "m64n128w8s2-wgmma-det", "m64n128w8s3-wgmma-det", "m128n64w8s2-wgmma-det"}));
  EXPECT_EQ(legal_names(backward(256, false, DType::F16), sm(90)),
            (std::vector<std::string>{"m64n64w8s2-wgmma-det"}));
  // Padded head dim 192: neither shape fits (64 keys x 192 columns of dK and dV per warpgroup
  // spill; two warpgroups cannot split 192 columns into whole 64-column blocks).
  EXPECT_TRUE(legal_names(backward(192), sm(90)).empty());
  // Padded to 128 and 256: the same sets as 128 and 256.
  EXPECT_EQ(legal_names(backward(96), sm(90)), legal_names(backward(128), sm(90)));
  EXPECT_EQ(legal_names(backward(200), sm(90)), legal_names(backward(256), sm(90)));
}

TEST(WgmmaBackwardConfig, EveryLegalConfigFitsTheDevice) {
  const DeviceSpec h100 = sm(90);
  for (int head_dim : {64, 96, 128, 256}) {
    const AttentionProblem p = backward(head_dim);
    for (const AttentionConfig& c : wgmma_backward_candidates(p)) {
      if (!check_wgmma_backward_config(c, p, h100).ok()) continue;
      EXPECT_LE(wgmma_backward_dkdv_smem_bytes(c, p), h100.smem_per_block_optin) << c.to_string();
      EXPECT_LE(wgmma_backward_dkdv_registers(c, p), 255) << c.to_string();
      if (c.dq == DqMode::Separate) {
        EXPECT_LE(wgmma_backward_dq_smem_bytes(c, p), h100.smem_per_block_optin) << c.to_string();
        EXPECT_LE(wgmma_backward_dq_registers(c, p), 255) << c.to_string();
      }
    }
  }
}

TEST(WgmmaBackwardConfig, SharedMemoryArithmetic) {
  // 64 keys per warpgroup, Atomic: 1024 + K, V (2 x 128 x 128 x 2) + Q, dO per stage
  // (2 x 2 x 64 x 128 x 2) + dS^T (128 x 64 x 2) + lse, delta per stage (2 x 2 x 64 x 4) + the
  // staged dQ tiles (2 tiles of 64 rows x (64 x 4 + 32) bytes).
  EXPECT_EQ(wgmma_backward_dkdv_smem_bytes(wgmma(64, 128, 8, 2), backward(128)),
            1024 + 65536 + 65536 + 16384 + 1024 + 2 * 64 * 288);
  // Separate: no dS^T tile in the dK/dV kernel (dS^T stays in registers).
  EXPECT_EQ(wgmma_backward_dkdv_smem_bytes(wgmma(64, 128, 8, 2, DqMode::Separate), backward(128)),
            1024 + 65536 + 65536 + 1024);
  // 64 keys shared by two warpgroups (d = 256): P^T and dS^T both in shared memory; Atomic adds
  // its 2 staged dQ tiles of 64 rows x (128 x 4 + 32) bytes.
  EXPECT_EQ(wgmma_backward_dkdv_smem_bytes(wgmma(64, 64, 8, 2, DqMode::Separate), backward(256)),
            1024 + 2 * 64 * 256 * 2 + 2 * 2 * 64 * 256 * 2 + 2 * 64 * 64 * 2 + 2 * 2 * 64 * 4);
  EXPECT_EQ(wgmma_backward_dkdv_smem_bytes(wgmma(64, 64, 8, 2), backward(256)),
            wgmma_backward_dkdv_smem_bytes(wgmma(64, 64, 8, 2, DqMode::Separate), backward(256)) +
                2 * 64 * 544);
  // The dQ kernel: Q, dO resident + K, V per stage; head dim padded to 64.
  EXPECT_EQ(wgmma_backward_dq_smem_bytes(wgmma(64, 128, 8, 3, DqMode::Separate), backward(128)),
            1024 + 2 * 64 * 128 * 2 + 2 * 3 * 128 * 128 * 2);
  EXPECT_EQ(wgmma_backward_dq_smem_bytes(wgmma(64, 64, 4, 2, DqMode::Separate), backward(96)),
            wgmma_backward_dq_smem_bytes(wgmma(64, 64, 4, 2, DqMode::Separate), backward(128)));
}

TEST(WgmmaBackwardConfig, LaunchShapes) {
  EXPECT_EQ(wgmma_backward_dkdv_threads(wgmma(64, 128, 8, 2)), 256);
  EXPECT_EQ(wgmma_backward_dkdv_threads(wgmma(128, 64, 4, 2)), 128);
  // The dQ kernel runs one warpgroup per 64 query rows, whatever the dK/dV kernel's warps.
  EXPECT_EQ(wgmma_backward_dq_threads(wgmma(64, 128, 8, 2, DqMode::Separate)), 128);
  EXPECT_EQ(wgmma_backward_dq_threads(wgmma(128, 64, 4, 2, DqMode::Separate)), 256);
}

TEST(WgmmaBackwardConfig, RejectionsNameTheCause) {
  const AttentionProblem p = backward(128);
  auto expect_rejected = [](const Status& status, const std::string& fragment) {
    ASSERT_FALSE(status.ok()) << "expected a rejection mentioning '" << fragment << "'";
    EXPECT_NE(status.error().message.find(fragment), std::string::npos) << status.error().message;
  };
  expect_rejected(check_wgmma_backward_config(wgmma(64, 128, 8, 2), p, sm(80)),
                  "wgmma kernels need sm90 (H100/H200); this device is sm80");
  AttentionProblem fp32 = p;
  fp32.dtype = DType::F32;
  expect_rejected(check_wgmma_backward_config(wgmma(64, 128, 8, 2), fp32, sm(90)), "dtype = f32");
  AttentionProblem deterministic = p;
  deterministic.deterministic = true;
  expect_rejected(check_wgmma_backward_config(wgmma(64, 128, 8, 2), deterministic, sm(90)),
                  "the problem is deterministic");
  EXPECT_TRUE(
      check_wgmma_backward_config(wgmma(64, 128, 8, 2, DqMode::Separate), deterministic, sm(90))
          .ok());
  expect_rejected(check_wgmma_backward_config({64, 128, 8, 2}, p, sm(90)), "not a wgmma config");
  expect_rejected(check_wgmma_backward_config(wgmma(32, 128, 8, 2), p, sm(90)),
                  "block_m = 32 not in {64, 128}");
  expect_rejected(check_wgmma_backward_config(wgmma(64, 256, 8, 2), p, sm(90)),
                  "block_n = 256 not in {64, 128}");
  expect_rejected(check_wgmma_backward_config(wgmma(64, 128, 12, 2), p, sm(90)),
                  "warps = 12 not in {4, 8}");
  expect_rejected(check_wgmma_backward_config(wgmma(64, 128, 8, 4), p, sm(90)),
                  "stages = 4 not in {2, 3}");
  expect_rejected(check_wgmma_backward_config(wgmma(64, 128, 4, 2), p, sm(90)),
                  "64 keys per warpgroup");
  expect_rejected(check_wgmma_backward_config(wgmma(64, 64, 8, 2), backward(64), sm(90)),
                  "multiple of 128");
  expect_rejected(check_wgmma_backward_config(wgmma(64, 128, 8, 2), backward(64), sm(90)),
                  "1 dQ tile(s) of 64 x 64 per step do not split over 2 warpgroups");
  expect_rejected(check_wgmma_backward_config(wgmma(128, 128, 8, 2, DqMode::Separate), p, sm(90)),
                  "dK/dV kernel: estimated 272 registers per thread exceed 255");
  expect_rejected(check_wgmma_backward_config(wgmma(128, 128, 8, 2), backward(64), sm(90)),
                  "spills at 255 registers (measured");
  // The staged dQ tiles' measured edge: m64n128w8 at d 128 is legal at 2 stages, not at 3;
  // m128n64w4 at d 64 at neither.
  EXPECT_TRUE(check_wgmma_backward_config(wgmma(64, 128, 8, 2), p, sm(90)).ok());
  expect_rejected(check_wgmma_backward_config(wgmma(64, 128, 8, 3), p, sm(90)),
                  "spills at 255 registers (measured");
  for (int stages : {2, 3})
    expect_rejected(check_wgmma_backward_config(wgmma(128, 64, 4, stages), backward(64), sm(90)),
                    "spills at 255 registers (measured");
  expect_rejected(
      check_wgmma_backward_config(wgmma(64, 64, 4, 2, DqMode::Separate), backward(256), sm(90)),
      "dK/dV kernel: estimated 336 registers per thread exceed 255");
  expect_rejected(check_wgmma_backward_config(wgmma(64, 64, 8, 3), backward(256), sm(90)),
                  "dK/dV kernel shared memory 350720 B exceeds the device's 232448 B per block");
  expect_rejected(
      check_wgmma_backward_config(wgmma(128, 64, 8, 2, DqMode::Separate), backward(256), sm(90)),
      "shared memory");
}

TEST(WgmmaBackwardConfig, ProposedDefaults) {
  auto default_of = [](const AttentionProblem& p) {
    Result<AttentionConfig> c = default_wgmma_backward_config(p, sm(90));
    return c.ok() ? c->to_string() : "error: " + c.error().message;
  };
  // dQ from its own kernel whether or not the problem asks for determinism (measured faster).
  EXPECT_EQ(default_of(backward(64)), "m128n64w4s2-wgmma-det");
  EXPECT_EQ(default_of(backward(128, true)), "m64n64w4s2-wgmma-det");
  EXPECT_EQ(default_of(backward(96)), "m64n64w4s2-wgmma-det");
  EXPECT_EQ(default_of(backward(256)), "m64n64w8s2-wgmma-det");
  AttentionProblem deterministic = backward(128);
  deterministic.deterministic = true;
  EXPECT_EQ(default_of(deterministic), "m64n64w4s2-wgmma-det");
  // Not an H100: an error naming the cause.
  Result<AttentionConfig> none = default_wgmma_backward_config(backward(128), sm(80));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::Unsupported);
  EXPECT_NE(none.error().message.find("no legal wgmma backward config for head_dim = 128"),
            std::string::npos)
      << none.error().message;
  EXPECT_FALSE(default_wgmma_backward_config(backward(192), sm(90)).ok());
  // Every default is legal.
  for (int head_dim : {32, 64, 72, 96, 128, 200, 256}) {
    const AttentionProblem p = backward(head_dim);
    Result<AttentionConfig> c = default_wgmma_backward_config(p, sm(90));
    ASSERT_TRUE(c.ok()) << head_dim << ": " << c.error().message;
    EXPECT_TRUE(check_wgmma_backward_config(c.value(), p, sm(90)).ok())
        << head_dim << ": " << message_of(check_wgmma_backward_config(c.value(), p, sm(90)));
  }
}

TEST(WgmmaBackwardConfig, PlanListsEveryCandidateWithItsStatus) {
  const std::string plan = explain_wgmma_backward_plan(backward(128), sm(90));
  for (const AttentionConfig& c : wgmma_backward_candidates(backward(128)))
    EXPECT_NE(plan.find(c.to_string() + " "), std::string::npos) << c.to_string() << "\n" << plan;
  EXPECT_NE(plan.find("legal"), std::string::npos) << plan;
  EXPECT_NE(plan.find("illegal: dK/dV kernel: estimated 272 registers"), std::string::npos) << plan;
  EXPECT_NE(plan.find("Proposed wgmma default: m64n64w4s2-wgmma-det\n"), std::string::npos) << plan;
  const std::string none = explain_wgmma_backward_plan(backward(128), sm(80));
  EXPECT_NE(none.find("no legal wgmma backward config"), std::string::npos) << none;
}

}  // namespace
}  // namespace flashjit
