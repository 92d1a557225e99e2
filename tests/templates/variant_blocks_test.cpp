// templates/attention_variant.h's shortcuts against its own per-key rule, visible(): for windows
// of every kind (unbounded, empty, small, wide, INT_MAX on either side), with and without causal
// and a prefix, at odd lengths and block shapes,
//   block_fully_visible(tile, block) is true only when every row of the tile (rows past seqlen_q
//     included, as the kernels ask) sees every key of the block, blocks past seqlen_k included
//     (the GPU kernels skip the per-score mask where it says true), and always then without a
//     prefix (with one, a block that the prefix and the band cover together is masked per score);
//   row_keys(row) gives visible(row, key) for every key as key < prefix_end || begin <= key < end
//     (the -ws softmax's mask).
// The header's constants are macros, so the host's C++ compiler (runtime/host_compiler.hpp)
// builds one source holding every case, each in a namespace of its own, as the generator renders
// the header (after attention_params.h and the variant's #defines).
#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "runtime/host_compiler.hpp"
#include "templates/embedded.hpp"

namespace flashjit {
namespace {

struct Case {
  bool causal;
  int left, right, prefix;  // the window's sides (-1: unbounded) and the prefix (0: none)
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const int lefts[] = {-1, 0, 3, 40, 1000, INT_MAX};
  const int rights[] = {-1, 0, 5, INT_MAX};
  for (int prefix : {0, 24})
    for (int left : lefts) {
      out.push_back({true, left, 0, prefix});
      for (int right : rights) out.push_back({false, left, right, prefix});
    }
  return out;
}

// One function per case: the number of (tile, block) and (row, key) pairs where a shortcut and
// visible() disagree, over the lengths and block shape given.
constexpr const char* kCheck = R"(
extern "C" long long CHECK_NAME(int seqlen_q, int seqlen_k, int block_m, int block_n) {
  namespace fv = flashjit_variant;
  FlashjitAttentionParams p{};
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  const int diagonal = seqlen_k - seqlen_q;
  const int rows = (seqlen_q + block_m - 1) / block_m * block_m;  // whole tiles
  const int keys = (seqlen_k + block_n - 1) / block_n * block_n + block_n;  // one block past
  long long wrong = 0;
  for (int m0 = 0; m0 < rows; m0 += block_m)
    for (int n0 = 0; n0 < keys; n0 += block_n) {
      bool every = true;
      for (int r = m0; r < m0 + block_m; ++r)
        for (int k = n0; k < n0 + block_n; ++k) every = every && fv::visible(p, diagonal, 0, 0, r, k);
      const bool shortcut = fv::block_fully_visible(p, diagonal, m0, block_m, n0, block_n);
      // Never true wrongly; false wrongly only where a block holds prefix keys and band keys
      // (the prefix and the band together cover it: masked per score, the same result).
      wrong += (shortcut && !every) || (!shortcut && every && FLASHJIT_VARIANT_PREFIX == 0);
    }
  for (int r = 0; r < rows; ++r) {
    const fv::RowKeys row = fv::row_keys(p, diagonal, r);
    for (int k = 0; k < keys; ++k)
      wrong += (k < row.prefix_end || (row.begin <= k && k < row.end)) !=
               fv::visible(p, diagonal, 0, 0, r, k);
  }
  return wrong;
}
)";

std::string check_name(size_t i) { return "flashjit_variant_blocks_check_" + std::to_string(i); }

std::string source(const std::vector<Case>& all) {
  std::string s(templates::text("attention_params.h"));
  for (size_t i = 0; i < all.size(); ++i) {
    const Case& c = all[i];
    s += "#undef FLASHJIT_ATTENTION_VARIANT_H\n";
    for (const char* name : {"CAUSAL", "WINDOW_LEFT", "WINDOW_RIGHT", "PREFIX", "ALIBI",
                             "SCORE_MOD", "MASK_MOD", "VARLEN", "SCORE_MOD_GRAD"})
      s += std::string("#undef FLASHJIT_VARIANT_") + name + "\n";
    s += "#define FLASHJIT_VARIANT 1\n#define FLASHJIT_VARIANT_CAUSAL " + std::to_string(c.causal) +
         "\n#define FLASHJIT_VARIANT_WINDOW_LEFT (" + std::to_string(c.left) +
         ")\n#define FLASHJIT_VARIANT_WINDOW_RIGHT (" + std::to_string(c.right) +
         ")\n#define FLASHJIT_VARIANT_PREFIX " + std::to_string(c.prefix) +
         "\n#define FLASHJIT_VARIANT_ALIBI 0\n#define FLASHJIT_VARIANT_SCORE_MOD 0\n"
         "#define FLASHJIT_VARIANT_MASK_MOD 0\n#define FLASHJIT_VARIANT_VARLEN 0\n"
         "#define FLASHJIT_VARIANT_SCORE_MOD_GRAD 0\n";
    // The case's check in its namespace too (extern "C" names are global all the same).
    std::string check = kCheck;
    check.replace(check.find("CHECK_NAME"), 10, check_name(i));
    s += "namespace variant_case_" + std::to_string(i) + " {\n";
    s += templates::text("attention_variant.h");
    s += check + "}  // namespace variant_case_" + std::to_string(i) + "\n";
  }
  return s;
}

TEST(VariantBlocks, ShortcutsAgreeWithVisibleForEveryWindow) {
  const std::vector<Case> all = cases();
  auto library = HostLibrary::build(source(all));
  if (!library.ok() && library.error().code == ErrorCode::Unsupported)
    GTEST_SKIP() << library.error().message;
  ASSERT_TRUE(library.ok()) << library.error().message;
  using Check = long long (*)(int, int, int, int);
  struct Shape {
    int seqlen_q, seqlen_k, block_m, block_n;
  };
  const Shape shapes[] = {{1, 1, 64, 64},    {17, 17, 16, 32},    {100, 37, 64, 16},
                          {37, 100, 16, 64}, {300, 300, 64, 128}, {129, 1000, 128, 64}};
  for (size_t i = 0; i < all.size(); ++i) {
    auto symbol = (*library)->lookup(check_name(i));
    ASSERT_TRUE(symbol.ok()) << symbol.error().message;
    const Check check = reinterpret_cast<Check>(*symbol);
    const Case& c = all[i];
    for (const Shape& s : shapes)
      EXPECT_EQ(check(s.seqlen_q, s.seqlen_k, s.block_m, s.block_n), 0)
          << "causal " << c.causal << " window (" << c.left << ", " << c.right << ") prefix "
          << c.prefix << ", seqlen_q " << s.seqlen_q << " seqlen_k " << s.seqlen_k << ", block "
          << s.block_m << " x " << s.block_n;
  }
}

}  // namespace
}  // namespace flashjit
