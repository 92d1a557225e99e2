#include "support/shapes.hpp"

namespace flashjit::testing {

std::string Shape::to_string() const {
  static const char* const kStorageNames[] = {"bshd", "bshd-padded", "bhsd"};
  return "(b" + std::to_string(batch) + " hq" + std::to_string(heads_q) + " hkv" +
         std::to_string(heads_kv) + " sq" + std::to_string(seqlen_q) + " sk" +
         std::to_string(seqlen_k) + " " + kStorageNames[static_cast<int>(storage)] + ")";
}

const std::vector<Shape>& gpu_test_shapes() {
  static const std::vector<Shape> shapes = {
      {1, 2, 2, 1, 1},
      {1, 2, 2, 17, 17},
      {1, 2, 2, 128, 128},
      {1, 1, 1, 1000, 1000},
      {1, 1, 1, 4097, 4097},
      {1, 2, 2, 100, 300},  // more keys than queries
      {1, 2, 2, 300, 100},  // more queries: causal leaves the first 200 rows empty
      {2, 2, 2, 1, 77},     // decode-like single query row
      {2, 8, 2, 257, 257},  // GQA 4:1
      {1, 4, 1, 129, 200},  // MQA
      {3, 2, 2, 64, 64},
      {2, 4, 2, 150, 190, Storage::kBshdPadded},
      {1, 2, 2, 200, 96, Storage::kBshdPadded},
      {2, 4, 4, 130, 130, Storage::kBhsd},
      {2, 4, 2, 70, 170, Storage::kBhsd},
  };
  return shapes;
}

const std::vector<Shape>& emulation_shapes() {
  static const std::vector<Shape> shapes = {
      {1, 1, 1, 1, 1},                          // a single row and key
      {1, 2, 2, 17, 17},                        // ragged tails
      {1, 1, 1, 130, 130},                      // several blocks, a ragged last one
      {1, 2, 2, 40, 100},                       // more keys than queries
      {1, 2, 2, 100, 40},                       // more queries: causal leaves 60 rows empty
      {2, 4, 2, 33, 65},                        // GQA 2:1, batches
      {1, 4, 1, 20, 50},                        // MQA
      {2, 2, 2, 50, 70, Storage::kBhsd},        // BHSD
      {1, 2, 2, 45, 77, Storage::kBshdPadded},  // padded strides, different per tensor
  };
  return shapes;
}

Strides padded_bshd(int64_t seqlen, int64_t heads, int head_dim, int head_pad, int seq_pad,
                    int batch_pad) {
  Strides strides;
  strides.head = head_dim + head_pad;
  strides.seq = heads * strides.head + seq_pad;
  strides.batch = seqlen * strides.seq + batch_pad;
  return strides;
}

AttentionProblem make_test_problem(const Shape& shape, int head_dim, DType dtype, bool causal,
                                   Pass pass) {
  const Layout layout = shape.storage == Storage::kBhsd ? Layout::BHSD : Layout::BSHD;
  AttentionProblem problem =
      AttentionProblem::make(shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q,
                             shape.seqlen_k, head_dim, dtype, causal, layout)
          .with_pass(pass);
  if (shape.storage == Storage::kBshdPadded) {
    problem.q_strides = padded_bshd(shape.seqlen_q, shape.heads_q, head_dim, 8, 24, 16);
    problem.k_strides = padded_bshd(shape.seqlen_k, shape.heads_kv, head_dim, 16, 24, 8);
    problem.v_strides = padded_bshd(shape.seqlen_k, shape.heads_kv, head_dim, 24, 8, 32);
    problem.o_strides = padded_bshd(shape.seqlen_q, shape.heads_q, head_dim, 8, 40, 8);
    problem.do_strides = padded_bshd(shape.seqlen_q, shape.heads_q, head_dim, 16, 8, 24);
    problem.dq_strides = padded_bshd(shape.seqlen_q, shape.heads_q, head_dim, 24, 16, 8);
    problem.dk_strides = padded_bshd(shape.seqlen_k, shape.heads_kv, head_dim, 8, 8, 16);
    problem.dv_strides = padded_bshd(shape.seqlen_k, shape.heads_kv, head_dim, 32, 16, 24);
  }
  return problem;
}

}  // namespace flashjit::testing
