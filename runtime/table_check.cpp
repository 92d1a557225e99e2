#include "runtime/table_check.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "templates/embedded.hpp"

namespace flashjit {

namespace {

// "1", "0" or null (unset, or another value).
const char* check_tables_env() {
  const char* value = std::getenv("FLASHJIT_CHECK_TABLES");
  if (value == nullptr) return nullptr;
  if (std::strcmp(value, "1") == 0) return "1";
  if (std::strcmp(value, "0") == 0) return "0";
  return nullptr;
}

}  // namespace

bool table_check_default() {
  const char* env = check_tables_env();
  if (env != nullptr) return env[0] == '1';
#ifdef NDEBUG
  return false;
#else
  return true;
#endif
}

bool table_check_requested(const AttentionArgs& args) {
  const char* env = check_tables_env();
  return args.check_tables || (env != nullptr && env[0] == '1');
}

FlashjitDecodeTables decode_tables_of(const AttentionProblem& problem, const AttentionArgs& args) {
  FlashjitDecodeTables tables{};
  const bool paged = problem.kv.paged();
  tables.block_table = paged ? args.block_table : nullptr;
  tables.seqlens_k = problem.kv.seqlens_k ? args.seqlens_k : nullptr;
  tables.batch = problem.batch;
  tables.max_pages = paged ? problem.kv.max_pages : 0;
  tables.num_pages = paged ? problem.kv.num_pages : 0;
  tables.page_size = paged ? problem.kv.page_size : 0;
  // The keys the cache holds per sequence (capacity() when paged: problem.seqlen_k is that then).
  tables.seqlen_k =
      paged ? std::min<int64_t>(problem.seqlen_k, problem.kv.capacity()) : problem.seqlen_k;
  return tables;
}

Status check_decode_tables(const FlashjitDecodeTables& tables) {
  const long long per = flashjit_tables_per_sequence(&tables);
  for (long long b = 0; b < tables.batch; ++b) {
    for (long long e = 0; e < per; ++e) {
      if (!flashjit_tables_entry_bad(&tables, b, e)) continue;
      const long long length = flashjit_tables_length(&tables, b);
      if (e == 0) {
        return make_error(ErrorCode::InvalidArgument,
                          "seqlens_k[" + std::to_string(b) + "] = " + std::to_string(length) +
                              ": must be in [0, " + std::to_string(tables.seqlen_k) +
                              "] (the keys the cache holds per sequence" +
                              (tables.block_table != nullptr ? ": max_pages * page_size" : "") +
                              ")");
      }
      const long long j = e - 1;
      return make_error(ErrorCode::InvalidArgument,
                        "block_table[" + std::to_string(b) + "][" + std::to_string(j) +
                            "] = " + std::to_string(tables.block_table[b * tables.max_pages + j]) +
                            ": must be a page in [0, " + std::to_string(tables.num_pages) +
                            ") (num_pages), used by seqlens_k[" + std::to_string(b) +
                            "] = " + std::to_string(length));
    }
  }
  return ok_status();
}

std::string decode_table_check_source() {
  return std::string(templates::text("checks/decode_tables.h"));
}

}  // namespace flashjit
