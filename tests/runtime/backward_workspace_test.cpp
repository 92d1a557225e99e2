// The backward's fp32 workspace layout (runtime/launch_params.hpp, backward_workspace) and the
// row kernels' grid (backward_launch): [batch, heads_q, round(seqlen_q)] rows; packed documents
// on the GPU packed by total_q, each document's rows of each head its own (128-aligned, room for
// its rows rounded up to 128, inside the head's rows, disjoint from every other document's and
// head's), far smaller than per-document rows when the lengths are uneven; the CPU's per-document
// rows. No device needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "generator/backward_config.hpp"
#include "generator/problem.hpp"
#include "runtime/launch_params.hpp"
#include "tuner/reference.hpp"

namespace flashjit {
namespace {

const AttentionConfig kAtomic = AttentionConfig::parse("m64n64w4s2").value();

AttentionProblem varlen_backward(const std::vector<int64_t>& lengths, int64_t spare) {
  int64_t total = spare, longest = 1;
  for (int64_t length : lengths) {
    total += length;
    longest = std::max(longest, length);
  }
  return AttentionProblem::make_varlen(static_cast<int64_t>(lengths.size()), 3, 1, longest, longest,
                                       total, total, 72, DType::BF16, true)
      .with_pass(Pass::Backward);
}

TEST(BackwardWorkspace, PlainProblemsHaveRowsPerBatchEntryAndHead) {
  const AttentionProblem p =
      AttentionProblem::make(2, 3, 1, 130, 17, 72, DType::BF16, false).with_pass(Pass::Backward);
  for (const bool packed : {false, true}) {
    const BackwardWorkspace w = backward_workspace(p, kAtomic, 1, packed);
    EXPECT_FALSE(w.packed_documents);
    EXPECT_EQ(w.seqlen_q_rounded, 256);
    EXPECT_EQ(w.row(p, nullptr, 1, 2, 5), (1 * 3 + 2) * 256 + 5);
    // delta, lse_log2 (256-byte aligned) and the accumulator (head dim 72 -> 128 floats a row).
    EXPECT_EQ(w.bytes, 2 * (2 * 3 * 256 * 4) + 2 * 3 * 256 * 128 * 4);
  }
}

TEST(BackwardWorkspace, PackedDocumentsHaveDisjointAlignedRowsWithinTheirHead) {
  const std::vector<int64_t> lengths = {1, 17, 0, 3, 100, 1, 128, 129, 0, 250};
  const AttentionProblem p = varlen_backward(lengths, 9);
  const std::vector<int32_t> cu = cu_seqlens_of(lengths);
  const BackwardWorkspace w = backward_workspace(p, kAtomic);
  ASSERT_TRUE(w.packed_documents);
  EXPECT_EQ(w.seqlen_q_rounded, round_to_row_blocks(p.variant.total_q) + 128 * 10);
  std::vector<std::pair<int64_t, int64_t>> taken;  // [first, end) of every (document, head)
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t first = w.row(p, cu.data(), b, h, 0);
      const int64_t end = first + round_to_row_blocks(lengths[b]);
      EXPECT_EQ(first % 128, 0) << b;
      EXPECT_GE(first, h * w.seqlen_q_rounded) << b << " " << h;
      EXPECT_LE(end, (h + 1) * w.seqlen_q_rounded) << b << " " << h;
      for (const auto& [other_first, other_end] : taken)
        EXPECT_TRUE(end <= other_first || other_end <= first) << b << " " << h;
      taken.emplace_back(first, end);
    }
  EXPECT_EQ(w.bytes, 2 * (3 * static_cast<size_t>(w.seqlen_q_rounded) * 4) +
                         3 * static_cast<size_t>(w.seqlen_q_rounded) * 128 * 4);
  // The CPU backend's per-document rows: [num_docs, heads_q, round(max_seqlen_q)].
  const BackwardWorkspace cpu = backward_workspace(p, kAtomic, 2, /*packed_documents=*/false);
  EXPECT_FALSE(cpu.packed_documents);
  EXPECT_EQ(cpu.seqlen_q_rounded, 256);
  EXPECT_EQ(cpu.row(p, cu.data(), 4, 1, 7), (4 * 3 + 1) * 256 + 7);
}

TEST(BackwardWorkspace, PackedDocumentsNeedFarLessThanPerDocumentRows) {
  std::vector<int64_t> lengths(63, 64);
  lengths.push_back(4096);  // one long document: per-document rows pad every other to 4096
  const AttentionProblem p = varlen_backward(lengths, 0);
  const size_t packed = backward_workspace(p, kAtomic).bytes;
  const size_t per_document = backward_workspace(p, kAtomic, 1, false).bytes;
  EXPECT_LT(packed * 10, per_document) << packed << " vs " << per_document;
}

TEST(BackwardWorkspace, TheRowKernelsCoverEachDocumentsRows) {
  const AttentionProblem p = varlen_backward({1, 300, 17}, 5);
  const KernelShape row{kBackwardPreprocessThreads, 0}, tile{128, 1024};
  for (const char* name : {"m64n64w4s2", "m64n64w4s2-det"}) {
    const AttentionConfig config = AttentionConfig::parse(name).value();
    const BackwardLaunch launch = backward_launch(p, config, BackwardShapes{row, tile, tile});
    // ceil(300 / 128) blocks of 128 rows for each of the 3 documents, not the packed rows'.
    EXPECT_EQ(launch.preprocess.grid_x, 3);
    EXPECT_EQ(launch.preprocess.grid_z, 3);
    if (config.dq == DqMode::Atomic) {
      EXPECT_EQ(launch.dq.grid_x, 3);
    }
  }
}

}  // namespace
}  // namespace flashjit
