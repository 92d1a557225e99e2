#include "support/block_mask_cases.hpp"

#include <cstring>

namespace flashjit::testing {

bool block_mask_case_mask(int mask_case, int64_t batch, int64_t head, int64_t q, int64_t k) {
  switch (mask_case) {
    case kDocuments48:
      return q / 48 == k / 48;
    case kEmptyRows:
      return q / 64 == k / 64 && !(q >= 64 && q < 160);
    case kNothingHidden:
      return true;
    case kAllHidden:
      return false;
    case kPerHead:
      return (k + head + 2 * batch) % 7 != 0 || q < 5;
    default:
      return false;
  }
}

const char* block_mask_case_name(int mask_case) {
  static const char* const names[] = {"documents48", "empty_rows", "nothing_hidden", "all_hidden",
                                      "per_head"};
  return mask_case >= 0 && mask_case < kMaskCases ? names[mask_case] : "?";
}

const char* block_mask_case_expression(int mask_case) {
  static const char* const expressions[] = {
      "(q_idx / 48) == (kv_idx / 48)",
      "(q_idx / 64) == (kv_idx / 64) && !(q_idx >= 64 && q_idx < 160)",
      "true",
      "false",
      "(kv_idx + head + 2 * batch) % 7 != 0 || q_idx < 5",
  };
  return mask_case >= 0 && mask_case < kMaskCases ? expressions[mask_case] : "false";
}

HostBlockMask host_block_mask(const BlockMaskShape& shape) {
  HostBlockMask host;
  host.shape = shape;
  host.storage.assign(shape.bytes() + 16, 0x7f);
  unsigned char* base = host.storage.data();
  host.map.q_count = reinterpret_cast<int*>(base + shape.q_count_offset());
  host.map.q_list = reinterpret_cast<int*>(base + shape.q_list_offset());
  host.map.k_count = reinterpret_cast<int*>(base + shape.k_count_offset());
  host.map.k_list = reinterpret_cast<int*>(base + shape.k_list_offset());
  host.map.states = base + shape.states_offset();
  host.map.q_tiles = static_cast<int>(shape.q_tiles());
  host.map.k_tiles = static_cast<int>(shape.k_tiles());
  host.map.block_m = shape.block_m;
  host.map.block_n = shape.block_n;
  host.map.maps = static_cast<int>(shape.maps());
  host.map.per_head = shape.per_head ? 1 : 0;
  host.map.heads_q = static_cast<int>(shape.heads_q);
  return host;
}

void fill_block_mask(HostBlockMask& host, const std::vector<unsigned char>& states) {
  const BlockMaskShape& s = host.shape;
  const int64_t qt = s.q_tiles(), kt = s.k_tiles();
  for (int64_t map = 0; map < s.maps(); ++map) {
    for (int64_t q = 0; q < qt; ++q) {
      int count = 0;
      for (int64_t k = 0; k < kt; ++k) {
        const unsigned char state = states[(map * qt + q) * kt + k];
        host.map.states[(map * qt + q) * kt + k] = state;
        if (state != 0)
          host.map.q_list[(map * qt + q) * kt + count++] =
              static_cast<int>((k << 1) | (state == 2));
      }
      host.map.q_count[map * qt + q] = count;
    }
    for (int64_t k = 0; k < kt; ++k) {
      int count = 0;
      for (int64_t q = 0; q < qt; ++q) {
        const unsigned char state = states[(map * qt + q) * kt + k];
        if (state != 0)
          host.map.k_list[(map * kt + k) * qt + count++] =
              static_cast<int>((q << 1) | (state == 2));
      }
      host.map.k_count[map * kt + k] = count;
    }
  }
}

std::string compare_block_mask(const HostBlockMask& built,
                               const std::vector<unsigned char>& expected) {
  const BlockMaskShape& s = built.shape;
  const int64_t qt = s.q_tiles(), kt = s.k_tiles();
  auto where = [&](int64_t map, int64_t q, int64_t k) {
    return "map " + std::to_string(map) + " tile (" + std::to_string(q) + ", " + std::to_string(k) +
           ") of " + s.to_string();
  };
  for (int64_t map = 0; map < s.maps(); ++map) {
    for (int64_t q = 0; q < qt; ++q) {
      int count = 0;
      for (int64_t k = 0; k < kt; ++k) {
        const int64_t at = (map * qt + q) * kt + k;
        if (built.map.states[at] != expected[at])
          return where(map, q, k) + ": state " + std::to_string(built.map.states[at]) +
                 ", expected " + std::to_string(expected[at]);
        if (expected[at] == 0) continue;
        const int entry = built.map.q_list[(map * qt + q) * kt + count++];
        if (entry != ((k << 1) | (expected[at] == 2)))
          return where(map, q, k) + ": q_list entry " + std::to_string(count - 1) + " is " +
                 std::to_string(entry);
      }
      if (built.map.q_count[map * qt + q] != count)
        return where(map, q, 0) + ": q_count " + std::to_string(built.map.q_count[map * qt + q]) +
               ", expected " + std::to_string(count);
    }
    for (int64_t k = 0; k < kt; ++k) {
      int count = 0;
      for (int64_t q = 0; q < qt; ++q) {
        const unsigned char state = expected[(map * qt + q) * kt + k];
        if (state == 0) continue;
        const int entry = built.map.k_list[(map * kt + k) * qt + count++];
        if (entry != ((q << 1) | (state == 2)))
          return where(map, q, k) + ": k_list entry " + std::to_string(count - 1) + " is " +
                 std::to_string(entry);
      }
      if (built.map.k_count[map * kt + k] != count)
        return where(map, 0, k) + ": k_count " + std::to_string(built.map.k_count[map * kt + k]) +
               ", expected " + std::to_string(count);
    }
  }
  return "";
}

}  // namespace flashjit::testing
