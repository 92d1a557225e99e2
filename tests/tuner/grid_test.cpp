// tuner/grid.hpp: the problems of a tuning grid over passes, the CPU's small grid, shards and
// the split over workers. Pure: no device.
#include "tuner/grid.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace flashjit {
namespace {

TEST(ProblemGrid, StandardGridIsTheForwardAlone) {
  auto problems = grid_problems(ProblemGrid{});
  ASSERT_TRUE(problems.ok()) << problems.error().describe();
  ASSERT_EQ(problems->size(), 36u);
  for (const AttentionProblem& p : *problems) {
    EXPECT_EQ(p.pass, Pass::Forward);
    EXPECT_EQ(p.batch, kGridDefaultTokens / p.seqlen_q);
    EXPECT_EQ(p.heads_q, kGridDefaultHidden / p.head_dim);
  }
}

TEST(ProblemGrid, BothPassesInterleavedPerShape) {
  ProblemGrid grid;
  grid.passes = {Pass::Forward, Pass::Backward};
  grid.deterministic = true;
  grid.dtypes = {DType::BF16, DType::F16};
  auto problems = grid_problems(grid);
  ASSERT_TRUE(problems.ok()) << problems.error().describe();
  ASSERT_EQ(problems->size(), 144u);
  std::set<std::string> keys;
  for (size_t i = 0; i < problems->size(); ++i) {
    const AttentionProblem& p = (*problems)[i];
    // Blocks of 6 seqlens: forward, then the same shapes backward.
    EXPECT_EQ(p.pass, (i / 6) % 2 == 0 ? Pass::Forward : Pass::Backward) << i;
    EXPECT_EQ(p.deterministic, p.is_backward()) << i;  // marks the backward problems only
    EXPECT_TRUE(validate(p).ok());
    if (p.is_backward()) {
      const AttentionProblem& forward = (*problems)[i - 6];
      EXPECT_EQ(forward.seqlen_q, p.seqlen_q);
      EXPECT_EQ(forward.batch, p.batch);
      EXPECT_EQ(forward.head_dim, p.head_dim);
      EXPECT_EQ(forward.causal, p.causal);
      EXPECT_EQ(forward.dtype, p.dtype);
    }
    keys.insert(p.to_string());
  }
  EXPECT_EQ(keys.size(), problems->size());  // no duplicates
}

TEST(ProblemGrid, FixedSizesGqaAndErrors) {
  ProblemGrid grid;
  grid.passes = {Pass::Backward};
  grid.head_dims = {64};
  grid.seqlens = {17, 1000};
  grid.batch = 3;
  grid.heads = 8;
  grid.kv_heads = 2;
  auto problems = grid_problems(grid);
  ASSERT_TRUE(problems.ok()) << problems.error().describe();
  ASSERT_EQ(problems->size(), 4u);
  for (const AttentionProblem& p : *problems) {
    EXPECT_EQ(p.batch, 3);
    EXPECT_EQ(p.heads_q, 8);
    EXPECT_EQ(p.heads_kv, 2);
    EXPECT_FALSE(p.deterministic);
  }
  EXPECT_EQ(grid_heads(grid, 64), 8);
  EXPECT_EQ(grid_kv_heads(grid, 64), 2);

  grid.kv_heads = 3;
  auto bad = grid_problems(grid);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("kv_heads = 3: must divide the query heads (8 for head "
                                     "dim 64)"),
            std::string::npos)
      << bad.error().message;
  grid.kv_heads = 0;
  grid.passes.clear();
  auto empty = grid_problems(grid);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("passes: empty"), std::string::npos);
  grid.passes = {Pass::Forward};
  grid.head_dims = {100};
  auto invalid = grid_problems(grid);
  ASSERT_FALSE(invalid.ok());
  EXPECT_NE(invalid.error().message.find("head_dim = 100"), std::string::npos);
}

TEST(ProblemGrid, CpuDefaultGrid) {
  ProblemGrid grid = cpu_default_grid();
  auto forward = grid_problems(grid);
  ASSERT_TRUE(forward.ok());
  EXPECT_EQ(forward->size(), 8u);
  grid.passes = {Pass::Forward, Pass::Backward};
  auto both = grid_problems(grid);
  ASSERT_TRUE(both.ok());
  ASSERT_EQ(both->size(), 16u);
  for (const AttentionProblem& p : *both) {
    EXPECT_EQ(p.batch, 1);
    EXPECT_EQ(p.heads_q, 4);
    EXPECT_EQ(p.dtype, DType::BF16);
  }
}

TEST(ProblemGrid, ShardsPartitionAndWorkersSplitContiguously) {
  ProblemGrid grid;
  grid.passes = {Pass::Forward, Pass::Backward};
  auto all = grid_problems(grid);
  ASSERT_TRUE(all.ok());
  std::multiset<std::string> seen;
  for (int i = 0; i < 7; ++i) {
    for (const AttentionProblem& p : select_shard(*all, Shard{i, 7})) seen.insert(p.to_string());
  }
  EXPECT_EQ(seen.size(), all->size());
  std::set<std::string> unique(seen.begin(), seen.end());
  EXPECT_EQ(unique.size(), all->size());

  const auto parts = split_for_workers(*all, 5);
  size_t next = 0;
  for (const auto& part : parts) {
    EXPECT_GE(part.size(), all->size() / 5);
    EXPECT_LE(part.size(), all->size() / 5 + 1);
    for (const AttentionProblem& p : part) EXPECT_EQ(p.to_string(), (*all)[next++].to_string());
  }
  EXPECT_EQ(next, all->size());
}

}  // namespace
}  // namespace flashjit
