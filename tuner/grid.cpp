#include "tuner/grid.hpp"

#include <algorithm>
#include <string>

namespace flashjit {

int64_t grid_heads(const ProblemGrid& grid, int head_dim) {
  if (grid.heads > 0) return grid.heads;
  return std::max<int64_t>(1, grid.hidden / std::max(1, head_dim));
}

int64_t grid_kv_heads(const ProblemGrid& grid, int head_dim) {
  return grid.kv_heads > 0 ? grid.kv_heads : grid_heads(grid, head_dim);
}

Result<std::vector<AttentionProblem>> grid_problems(const ProblemGrid& grid) {
  auto empty = [](const char* field) {
    return make_error(ErrorCode::InvalidArgument,
                      std::string("grid ") + field + ": empty; give at least one value");
  };
  if (grid.dtypes.empty()) return empty("dtypes");
  if (grid.head_dims.empty()) return empty("head_dims");
  if (grid.causal.empty()) return empty("causal");
  if (grid.passes.empty()) return empty("passes");
  if (grid.seqlens.empty()) return empty("seqlens");
  if (grid.batch <= 0 && grid.tokens <= 0) {
    return make_error(ErrorCode::InvalidArgument,
                      "grid tokens = " + std::to_string(grid.tokens) + ": must be > 0");
  }
  if (grid.heads <= 0 && grid.hidden <= 0) {
    return make_error(ErrorCode::InvalidArgument,
                      "grid hidden = " + std::to_string(grid.hidden) + ": must be > 0");
  }

  std::vector<AttentionProblem> problems;
  for (DType dtype : grid.dtypes) {
    for (int d : grid.head_dims) {
      const int64_t heads_q = grid_heads(grid, d);
      const int64_t heads_kv = grid_kv_heads(grid, d);
      if (heads_kv > heads_q || heads_q % heads_kv != 0) {
        return make_error(ErrorCode::InvalidArgument,
                          "grid kv_heads = " + std::to_string(heads_kv) +
                              ": must divide the query heads (" + std::to_string(heads_q) +
                              " for head dim " + std::to_string(d) + ")");
      }
      for (bool causal : grid.causal) {
        for (Pass pass : grid.passes) {
          for (int64_t n : grid.seqlens) {
            const int64_t b = grid.batch > 0 ? grid.batch : std::max<int64_t>(1, grid.tokens / n);
            AttentionProblem problem =
                AttentionProblem::make(b, heads_q, heads_kv, n, n, d, dtype, causal);
            problem.pass = pass;
            problem.deterministic = pass == Pass::Backward && grid.deterministic;
            FLASHJIT_TRY(validate(problem));
            problems.push_back(problem);
          }
        }
      }
    }
  }
  return problems;
}

ProblemGrid cpu_default_grid() {
  ProblemGrid grid;
  grid.head_dims = {64, 128};
  grid.seqlens = {256, 1024};
  grid.batch = 1;
  grid.heads = 4;
  return grid;
}

std::vector<AttentionProblem> select_shard(const std::vector<AttentionProblem>& problems,
                                           const Shard& shard) {
  std::vector<AttentionProblem> selected;
  for (size_t i = 0; i < problems.size(); ++i) {
    if (static_cast<int64_t>(i % shard.count) == shard.index) selected.push_back(problems[i]);
  }
  return selected;
}

std::vector<std::vector<AttentionProblem>> split_for_workers(
    const std::vector<AttentionProblem>& problems, int workers) {
  workers = std::max(1, workers);
  std::vector<std::vector<AttentionProblem>> parts(static_cast<size_t>(workers));
  const size_t n = problems.size();
  for (size_t w = 0, begin = 0; w < parts.size(); ++w) {
    const size_t end = n * (w + 1) / parts.size();
    parts[w].assign(problems.begin() + begin, problems.begin() + end);
    begin = end;
  }
  return parts;
}

}  // namespace flashjit
