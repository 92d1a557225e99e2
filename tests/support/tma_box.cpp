#include "support/tma_box.hpp"

namespace flashjit::testing {

TensorMapSpec tma_probe_spec(const void* base, int box_rows) {
  TensorMapSpec spec;
  spec.tensor = "probe";
  spec.base = base;
  spec.dtype = DType::BF16;
  const uint64_t head = 96 + 8, seq = 3 * head + 16, batch = 100 * seq + 8;
  spec.dims[0] = 96;
  spec.dims[1] = 100;
  spec.dims[2] = 3;
  spec.dims[3] = 2;
  spec.strides_bytes[0] = seq * 2;
  spec.strides_bytes[1] = head * 2;
  spec.strides_bytes[2] = batch * 2;
  spec.box[0] = 64;
  spec.box[1] = static_cast<uint32_t>(box_rows);
  spec.box[2] = spec.box[3] = 1;
  return spec;
}

std::vector<uint16_t> tma_box_image(const TensorMapSpec& spec, const int (&coords)[4],
                                    const uint16_t* tensor) {
  const int columns = static_cast<int>(spec.box[0]);
  const int rows = static_cast<int>(spec.box[1] * spec.box[2] * spec.box[3]);
  std::vector<uint16_t> image(static_cast<size_t>(columns) * rows, 0);
  for (uint32_t i3 = 0; i3 < spec.box[3]; ++i3)
    for (uint32_t i2 = 0; i2 < spec.box[2]; ++i2)
      for (uint32_t i1 = 0; i1 < spec.box[1]; ++i1)
        for (int col = 0; col < columns; ++col) {
          const int64_t g[4] = {coords[0] + int64_t{col}, coords[1] + int64_t{i1},
                                coords[2] + int64_t{i2}, coords[3] + int64_t{i3}};
          bool inside = true;
          for (int d = 0; d < 4; ++d)
            inside = inside && g[d] >= 0 && static_cast<uint64_t>(g[d]) < spec.dims[d];
          if (!inside) continue;
          const int64_t byte = g[0] * 2 + g[1] * static_cast<int64_t>(spec.strides_bytes[0]) +
                               g[2] * static_cast<int64_t>(spec.strides_bytes[1]) +
                               g[3] * static_cast<int64_t>(spec.strides_bytes[2]);
          const int row = static_cast<int>((i3 * spec.box[2] + i2) * spec.box[1] + i1);
          image[tma_box_index(row, col)] = tensor[byte / 2];
        }
  return image;
}

}  // namespace flashjit::testing
