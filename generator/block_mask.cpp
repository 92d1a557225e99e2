#include "generator/block_mask.hpp"

#include <cctype>
#include <sstream>

#include "generator/variant.hpp"
#include "templates/embedded.hpp"

namespace flashjit {
namespace {

size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

bool mask_mod_uses_batch_or_head(const std::string& expression) {
  size_t i = 0;
  while (i < expression.size()) {
    const unsigned char c = static_cast<unsigned char>(expression[i]);
    if (std::isalpha(c) || c == '_') {
      size_t end = i;
      while (end < expression.size() &&
             (std::isalnum(static_cast<unsigned char>(expression[end])) || expression[end] == '_'))
        ++end;
      const std::string word = expression.substr(i, end - i);
      if (word == "batch" || word == "head") return true;
      i = end;
    } else if (std::isdigit(c)) {  // a number's suffix (1e5f, 0x1f) is no identifier
      while (i < expression.size() &&
             (std::isalnum(static_cast<unsigned char>(expression[i])) || expression[i] == '.'))
        ++i;
    } else {
      ++i;
    }
  }
  return false;
}

size_t BlockMaskShape::q_list_offset() const {
  return q_count_offset() + align256(static_cast<size_t>(maps() * q_tiles()) * sizeof(int32_t));
}
size_t BlockMaskShape::k_count_offset() const {
  return q_list_offset() +
         align256(static_cast<size_t>(maps() * q_tiles() * k_tiles()) * sizeof(int32_t));
}
size_t BlockMaskShape::k_list_offset() const {
  return k_count_offset() + align256(static_cast<size_t>(maps() * k_tiles()) * sizeof(int32_t));
}
size_t BlockMaskShape::states_offset() const {
  return k_list_offset() +
         align256(static_cast<size_t>(maps() * k_tiles() * q_tiles()) * sizeof(int32_t));
}
size_t BlockMaskShape::bytes() const {
  return states_offset() + align256(static_cast<size_t>(maps() * q_tiles() * k_tiles()));
}

std::string BlockMaskShape::to_string() const {
  std::ostringstream out;
  out << "q " << seqlen_q << " k " << seqlen_k << " m" << block_m << " n" << block_n;
  if (per_head)
    out << " (per batch, head: " << maps() << " maps)";
  else
    out << " (one map)";
  return out.str();
}

BlockMaskShape block_mask_shape(const AttentionProblem& problem, int block_m, int block_n) {
  BlockMaskShape shape;
  shape.seqlen_q = problem.seqlen_q;
  shape.seqlen_k = problem.seqlen_k;
  shape.block_m = block_m;
  shape.block_n = block_n;
  shape.per_head = mask_mod_uses_batch_or_head(problem.variant.mask_mod);
  // One map serves any batch and head count: equal shapes whatever they are (a kernel's cached
  // map and a caller's are reused across them).
  shape.batch = shape.per_head ? problem.batch : 1;
  shape.heads_q = shape.per_head ? problem.heads_q : 1;
  return shape;
}

std::string block_mask_key(const AttentionProblem& problem) {
  const Variant& v = problem.variant;
  std::ostringstream out;
  out << (problem.causal ? "causal" : "non-causal") << " window(" << v.window_left << ","
      << v.window_right << ") prefix" << v.prefix << " mask_mod:" << v.mask_mod;
  return out.str();
}

bool block_mask_applies(const AttentionProblem& problem, const AttentionConfig& config) {
  if (problem.variant.mask_mod.empty() || problem.variant.varlen) return false;
  if (problem.is_backward())
    return config.family == KernelFamily::Mma || config.family == KernelFamily::Wgmma;
  return config.family == KernelFamily::Mma || config.family == KernelFamily::Ws;
}

Result<KernelSource> render_block_mask_builder(const AttentionProblem& problem) {
  if (problem.variant.mask_mod.empty())
    return make_error(ErrorCode::InvalidArgument,
                      "a block map is built from a mask_mod: this problem has none");
  const std::string_view params = templates::text("attention_params.h");
  const std::string_view builder = templates::text("cuda/block_mask.cuh");
  if (params.empty() || builder.empty())
    return make_error(ErrorCode::Unsupported,
                      "attention_params.h or cuda/block_mask.cuh is not embedded in this build");
  // Only what decides visibility (block_mask_key): one source per key.
  AttentionProblem canonical =
      AttentionProblem::make(1, 1, 1, 1, 1, 64, DType::BF16, problem.causal);
  canonical.variant.window_left = problem.variant.window_left;
  canonical.variant.window_right = problem.variant.window_right;
  canonical.variant.prefix = problem.variant.prefix;
  canonical.variant.mask_mod = problem.variant.mask_mod;
  Result<std::string> prelude = render_variant_prelude(canonical);
  if (!prelude.ok()) return prelude.error();
  KernelSource source;
  source.entries = {kBlockMaskStatesEntry, kBlockMaskListsEntry};
  source.label =
      "block mask builder " + canonical.variant.key() + (problem.causal ? " causal" : "");
  std::ostringstream text;
  text << "// flashjit " << source.label << "\n"
       << params << "\n"
       << *prelude << builder << "\n// ---- entries ----\n"
       << "extern \"C\" __global__ void __launch_bounds__(flashjit_kernel::kBlockMaskThreads)\n"
       << kBlockMaskStatesEntry << "(const __grid_constant__ FlashjitAttentionParams params,\n"
       << "    const __grid_constant__ FlashjitBlockMask mask) {\n"
       << "  flashjit_kernel::block_mask_states(params, mask);\n}\n"
       << "extern \"C\" __global__ void __launch_bounds__(flashjit_kernel::kBlockMaskThreads)\n"
       << kBlockMaskListsEntry << "(const __grid_constant__ FlashjitBlockMask mask) {\n"
       << "  flashjit_kernel::block_mask_lists(mask);\n}\n";
  source.text = text.str();
  return source;
}

}  // namespace flashjit
