// Packed variable-length documents (Variant::varlen, issue 17) in the generator: validation with
// typed errors naming the bad value, the key, spans of the packed tensors, the host check of the
// offsets (check_cu_seqlens), which families take it (mma, wgmma, -ws, HIP and the CPU; not
// decode; the backward the CPU only), and the plain kernels' generator version left as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "generator/config.hpp"
#include "generator/cpu_config.hpp"
#include "generator/device.hpp"
#include "generator/hip_config.hpp"
#include "generator/render.hpp"
#include "runtime/backend.hpp"
#include "runtime/launch_params.hpp"
#include "templates/embedded.hpp"

namespace flashjit {
namespace {

AttentionProblem varlen(bool causal = true) {
  return AttentionProblem::make_varlen(/*num_docs=*/3, 8, 2, /*max_seqlen_q=*/1000,
                                       /*max_seqlen_k=*/900, /*total_q=*/1500, /*total_k=*/1200,
                                       128, DType::BF16, causal);
}

void expect_error(const Status& status, ErrorCode code, const std::string& needle) {
  ASSERT_FALSE(status.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_EQ(status.error().code, code) << status.error().message;
  EXPECT_NE(status.error().message.find(needle), std::string::npos) << status.error().message;
}

TEST(Varlen, ValidatesWithTheVarlenNames) {
  EXPECT_TRUE(validate(varlen()).ok()) << validate(varlen()).error().describe();
  AttentionProblem p = varlen();
  p.batch = 0;
  expect_error(validate(p), ErrorCode::InvalidArgument, "num_docs = 0");
  p = varlen();
  p.seqlen_q = 0;
  expect_error(validate(p), ErrorCode::InvalidArgument, "max_seqlen_q = 0");
  p = varlen();
  p.seqlen_k = -3;
  expect_error(validate(p), ErrorCode::InvalidArgument, "max_seqlen_k = -3");
  p = varlen();
  p.variant.total_q = 0;
  expect_error(validate(p), ErrorCode::InvalidArgument, "total_q = 0");
  p = varlen();
  p.k_strides.batch = 900 * 2 * 128;
  expect_error(validate(p), ErrorCode::InvalidArgument, "k.batch stride = 230400");
  p = AttentionProblem::make(1, 1, 1, 16, 16, 64, DType::BF16, false);
  p.variant.total_k = 5;  // totals without varlen
  expect_error(validate(p), ErrorCode::InvalidArgument, "total_k = 5");
  // Contiguous K/V only. The backward: valid (the CPU backend's; the CUDA backward configs refuse
  // it: tests/runtime/cpu/cpu_backward_variant_test.cpp).
  EXPECT_TRUE(validate(varlen().with_pass(Pass::Backward)).ok());
  p = varlen();
  p.kv.seqlens_k = true;
  expect_error(validate(p), ErrorCode::Unsupported, "seqlens_k");
}

TEST(Varlen, KeySpansAndLse) {
  const AttentionProblem p = varlen();
  EXPECT_TRUE(p.variant.active());
  EXPECT_EQ(p.variant.key(), "varlen");
  AttentionProblem windowed = p;
  windowed.variant.window_left = 64;
  EXPECT_EQ(windowed.variant.key(), "window(64,-1) varlen");
  // The totals are launch sizes, not compiled in.
  AttentionProblem other = p;
  other.variant.total_q = 7777;
  EXPECT_EQ(ProblemSignature::of(other), ProblemSignature::of(p));
  EXPECT_EQ(p.q_span(), 1500 * 8 * 128);
  EXPECT_EQ(p.o_span(), 1500 * 8 * 128);
  EXPECT_EQ(p.kv_span(), 1200 * 2 * 128);
  EXPECT_EQ(p.lse_elements(), 8 * 1500);
  EXPECT_NE(p.to_string().find("varlen, total_q=1500, total_k=1200"), std::string::npos)
      << p.to_string();
}

TEST(Varlen, HostOffsetsAreChecked) {
  const std::vector<int32_t> good = {0, 3, 3, 10};
  EXPECT_TRUE(check_cu_seqlens("cu_seqlens_q", good.data(), 3, 7, 12).ok());
  const std::vector<int32_t> first = {2, 3, 3, 10};
  expect_error(check_cu_seqlens("cu_seqlens_q", first.data(), 3, 7, 12), ErrorCode::InvalidArgument,
               "cu_seqlens_q[0] = 2: must be 0");
  const std::vector<int32_t> down = {0, 3, 2, 10};
  expect_error(check_cu_seqlens("cu_seqlens_k", down.data(), 3, 8, 12), ErrorCode::InvalidArgument,
               "cu_seqlens_k[2] = 2 < cu_seqlens_k[1] = 3");
  expect_error(check_cu_seqlens("cu_seqlens_q", good.data(), 3, 6, 12), ErrorCode::InvalidArgument,
               "document 2 has 7 rows");
  expect_error(check_cu_seqlens("cu_seqlens_q", good.data(), 3, 7, 9), ErrorCode::InvalidArgument,
               "cu_seqlens_q[3] = 10: past the packed tensor's 9 rows");
  expect_error(check_cu_seqlens("cu_seqlens_q", nullptr, 3, 7, 9), ErrorCode::InvalidArgument,
               "cu_seqlens_q is null");
}

TEST(Varlen, EveryForwardFamilyButDecode) {
  const AttentionProblem p = varlen();
  for (const char* arch : {"sm80", "sm90"}) {
    const DeviceSpec device = known_device(arch).value();
    const bool sm90 = std::string(arch) == "sm90";
    const std::vector<AttentionConfig> legal = legal_configs(p, device);
    ASSERT_FALSE(legal.empty()) << arch;
    for (const KernelFamily family : {KernelFamily::Wgmma, KernelFamily::Ws})
      EXPECT_EQ(std::any_of(legal.begin(), legal.end(),
                            [&](const AttentionConfig& c) { return c.family == family; }),
                sm90)
          << arch << " family " << static_cast<int>(family);
    // sm90: the -ws default (d128: -ws at any size, ws_is_default).
    EXPECT_EQ(default_config(p, device).value().family, sm90 ? KernelFamily::Ws : KernelFamily::Mma)
        << arch;
  }
  const DeviceSpec h100 = known_device("sm90").value();
  for (const char* name : {"m128n64w8s2-wgmma", "m128n128w12s2-ws-pp-persist", "m64n64w4s2"}) {
    const Status status = check_config(AttentionConfig::parse(name).value(), p, h100);
    EXPECT_TRUE(status.ok()) << status.error().describe();
  }
  // A decode-shaped varlen problem: no -decode configs.
  const AttentionProblem decode =
      AttentionProblem::make_varlen(4, 32, 8, 1, 4096, 4, 9000, 128, DType::BF16, false);
  for (const AttentionConfig& c : legal_configs(decode, h100))
    EXPECT_NE(c.family, KernelFamily::Decode) << c.to_string();
  // HIP: configs whose source enters through attention_forward_variant (hip_config_test).
  EXPECT_FALSE(legal_hip_configs(p, known_device("gfx90a").value()).empty());
  // The CPU backend renders the document view in.
  AttentionProblem f32 = p;
  f32.dtype = DType::F32;
  const std::vector<AttentionConfig> cpu = legal_cpu_configs(f32, known_cpu());
  ASSERT_FALSE(cpu.empty());
  Result<KernelSource> source = render_cpu_attention(f32, cpu.front());
  ASSERT_TRUE(source.ok()) << source.error().describe();
  EXPECT_NE(source->text.find("#define FLASHJIT_VARIANT_VARLEN 1\n"), std::string::npos);
  // The mma source enters through attention_forward_varlen.
  source = render_cuda_attention(p, AttentionConfig{64, 64, 4, 2});
  ASSERT_TRUE(source.ok()) << source.error().describe();
  EXPECT_NE(source->text.find("flashjit_kernel::attention_forward_varlen<Config>(params);"),
            std::string::npos);
  EXPECT_NE(source->label.find("varlen"), std::string::npos);
}

// The GPU launch check wants both offsets (device pointers, 4-byte aligned); the launch
// parameters carry them for a varlen problem only.
TEST(Varlen, TheLaunchCheckWantsTheOffsets) {
  const AttentionProblem p = varlen();
  alignas(16) static unsigned char buffer[64];
  const int32_t offsets[4] = {0, 1, 2, 3};
  AttentionArgs args{buffer, buffer, buffer, buffer};
  const ProblemSignature signature = ProblemSignature::of(p);
  expect_error(check_attention_launch(p, args, signature), ErrorCode::InvalidArgument,
               "cu_seqlens_q = 0x0: packed variable-length documents need the int32 row offsets "
               "of each document ([num_docs + 1] = 4)");
  args.cu_seqlens_q = offsets;
  expect_error(check_attention_launch(p, args, signature), ErrorCode::InvalidArgument,
               "cu_seqlens_k = 0x0");
  args.cu_seqlens_k = reinterpret_cast<const int32_t*>(buffer + 2);
  expect_error(check_attention_launch(p, args, signature), ErrorCode::InvalidArgument,
               "cu_seqlens_k = 0x");
  args.cu_seqlens_k = offsets;
  EXPECT_TRUE(check_attention_launch(p, args, signature).ok());
  const FlashjitAttentionParams params = make_launch_params(p, args);
  EXPECT_EQ(params.cu_seqlens_q, offsets);
  EXPECT_EQ(params.cu_seqlens_k, offsets);
  EXPECT_EQ(params.batch, 3);
  EXPECT_EQ(params.seqlen_q, 1000);
  EXPECT_EQ(params.q_batch_stride, 0);
  // A plain problem's parameters carry none (its kernels never read them).
  const AttentionProblem plain = AttentionProblem::make(1, 8, 2, 64, 64, 128, DType::BF16, false);
  const FlashjitAttentionParams plain_params = make_launch_params(plain, args);
  EXPECT_EQ(plain_params.cu_seqlens_q, nullptr);
  EXPECT_EQ(plain_params.cu_seqlens_k, nullptr);
}

// What the varlen code added to the shared templates is all inside `#ifdef FLASHJIT_VARIANT`
// blocks and the launch parameters' variant fields: the plain text of each template (what plain
// kernels' generator version hashes) has none of it.
TEST(Varlen, PlainKernelTextHasNoneOfIt) {
  const std::vector<std::string> words = {"varlen", "VARLEN", "cu_seqlens", "document_view"};
  // -ws besides: the tile's place in the packed maps, the per-document params, the zeroed V
  // rows and the bounded O stores.
  std::vector<std::string> ws_words = words;
  ws_words.insert(ws_words.end(), {"q_row", "k_row", "map_batch", "WsTileParams",
                                   "WsVariantTileScheduler", "ws_zero_rows_from", "ws_store_rows"});
  for (const auto& [path, absent] : std::vector<std::pair<const char*, std::vector<std::string>>>{
           {"cuda/attention_fwd.cuh", words},
           {"cpu/attention_fwd.hpp", words},
           {"attention_params.h", words},
           {"cuda/ws/tile_scheduler.cuh", ws_words},
           {"cuda/ws/mainloop.cuh", ws_words},
           {"cuda/ws/epilogue.cuh", ws_words},
           {"cuda/ws/attention_fwd_ws.cuh", ws_words}}) {
    const std::string text(templates::text(path));
    ASSERT_FALSE(text.empty()) << path;
    const std::string plain = plain_kernel_text(text);
    for (const std::string& word : absent)
      EXPECT_EQ(plain.find(word), std::string::npos) << path << ": " << word;
  }
}

}  // namespace
}  // namespace flashjit
