// The recorded problems of a tuning DB (problems the runtime served untuned, replayed by
// `flashjit tune --recorded`): TuningStore::record_miss and recorded_problems. A row keeps the
// problem's shape, its K/V layout and its variant: the variant's key (part of the row's key) and
// its whole definition (variant_spec below: user expressions as written, varlen totals), so that
// the replay builds the same problem.
#include <sqlite3.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/tuning_store_impl.hpp"
#include "runtime/tuning_store_schema.hpp"

namespace flashjit {
namespace {

using tuning_db::deterministic_column;
using tuning_db::kNowSql;
using tuning_db::Statement;
using tuning_db::Transaction;

// The variant as text: "name=value" fields joined by ';' (window=L,R; softcap=C; alibi;
// prefix=P; score_mod=E; mask_mod=E; score_mod_grad=E; varlen=TQ,TK), "" for plain attention. A
// user expression never holds a ';' (check_variant_expression refuses it), and its value is the
// rest of the field after the first '=', so it comes back as written.
std::string variant_spec(const Variant& v) {
  if (!v.active()) return "";
  std::string out;
  auto add = [&](const std::string& field) { out += (out.empty() ? "" : ";") + field; };
  if (v.has_window())
    add("window=" + std::to_string(v.window_left) + "," + std::to_string(v.window_right));
  if (v.softcap) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", static_cast<double>(*v.softcap));  // exact float
    add(std::string("softcap=") + text);
  }
  if (v.alibi) add("alibi");
  if (v.prefix > 0) add("prefix=" + std::to_string(v.prefix));
  if (!v.score_mod.empty()) add("score_mod=" + v.score_mod);
  if (!v.mask_mod.empty()) add("mask_mod=" + v.mask_mod);
  if (!v.score_mod_grad.empty()) add("score_mod_grad=" + v.score_mod_grad);
  if (v.varlen) add("varlen=" + std::to_string(v.total_q) + "," + std::to_string(v.total_k));
  return out;
}

// Two integers "A,B"; false unless the whole text is that.
bool parse_pair(const std::string& text, int64_t& a, int64_t& b) {
  char* end = nullptr;
  a = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != ',') return false;
  const char* second = end + 1;
  b = std::strtoll(second, &end, 10);
  return end != second && *end == '\0';
}

// variant_spec's inverse; nullopt for text it does not write (a hand-edited row).
std::optional<Variant> parse_variant_spec(std::string_view spec) {
  Variant v;
  while (!spec.empty()) {
    const size_t end = spec.find(';');
    const std::string_view field = spec.substr(0, end);
    spec = end == std::string_view::npos ? std::string_view() : spec.substr(end + 1);
    const size_t eq = field.find('=');
    const std::string name(field.substr(0, eq));
    const std::string value(eq == std::string_view::npos ? "" : field.substr(eq + 1));
    char* stop = nullptr;
    if (name == "window") {
      if (!parse_pair(value, v.window_left, v.window_right)) return std::nullopt;
    } else if (name == "softcap") {
      v.softcap = std::strtof(value.c_str(), &stop);
      if (value.empty() || *stop != '\0') return std::nullopt;
    } else if (name == "alibi" && eq == std::string_view::npos) {
      v.alibi = true;
    } else if (name == "prefix") {
      v.prefix = std::strtoll(value.c_str(), &stop, 10);
      if (value.empty() || *stop != '\0') return std::nullopt;
    } else if (name == "score_mod" && !value.empty()) {
      v.score_mod = value;
    } else if (name == "mask_mod" && !value.empty()) {
      v.mask_mod = value;
    } else if (name == "score_mod_grad" && !value.empty()) {
      v.score_mod_grad = value;
    } else if (name == "varlen") {
      if (!parse_pair(value, v.total_q, v.total_k)) return std::nullopt;
      v.varlen = true;
    } else {
      return std::nullopt;
    }
  }
  return v;
}

}  // namespace

Status TuningStore::record_miss(const DeviceFingerprint& device, const AttentionProblem& problem) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& impl = *impl_;
  std::string sql = "INSERT INTO recorded_problems (";
  sql += tuning_db::kRecordedColumns;
  sql += ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ";
  sql += kNowSql;
  sql += ", ";
  sql += kNowSql;
  sql += ") ON CONFLICT (";
  sql += tuning_db::kRecordedKey;
  sql +=
      ") DO UPDATE SET uses = uses + 1, last_seen = excluded.last_seen, "
      "variant_spec = excluded.variant_spec";
  Result<Statement> stmt = impl.prepare(sql);
  if (!stmt.ok()) return stmt.error();
  int i = 1;
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, device.to_string())));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, std::string_view(to_string(problem.pass)))));
  FLASHJIT_TRY(
      impl.bound(stmt->bind(i++, deterministic_column(problem.pass, problem.deterministic))));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, int64_t{problem.head_dim})));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, std::string_view(to_string(problem.dtype)))));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, int64_t{problem.causal ? 1 : 0})));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, problem.batch)));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, problem.heads_q)));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, problem.heads_kv)));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, problem.seqlen_q)));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, problem.seqlen_k)));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, int64_t{problem.kv.page_size})));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, int64_t{problem.kv.seqlens_k ? 1 : 0})));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, problem.variant.key())));
  FLASHJIT_TRY(impl.bound(stmt->bind(i++, variant_spec(problem.variant))));

  Transaction transaction(impl);
  FLASHJIT_TRY(transaction.begin());
  FLASHJIT_TRY(tuning_db::record_device(impl, device));
  FLASHJIT_TRY(impl.run(*stmt, "recording a problem"));
  return transaction.commit();
}

Result<std::vector<AttentionProblem>> TuningStore::recorded_problems(
    const DeviceFingerprint& device) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& impl = *impl_;
  Result<Statement> stmt = impl.prepare(
      "SELECT batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, causal, pass, "
      "deterministic, page_size, seqlens_k, variant, variant_spec FROM recorded_problems WHERE "
      "device = ? ORDER BY uses DESC, last_seen DESC");
  if (!stmt.ok()) return stmt.error();
  FLASHJIT_TRY(impl.bound(stmt->bind(1, device.to_string())));
  std::vector<AttentionProblem> problems;
  FLASHJIT_TRY(impl.each_row(*stmt, "reading recorded problems", [&] {
    Result<DType> dtype = parse_dtype(stmt->text_at(6));
    Result<Pass> pass = parse_pass(stmt->text_at(8));
    const std::optional<Variant> variant = parse_variant_spec(stmt->text_at(13));
    // A hand-edited row: not a dtype, pass or variant this build knows, or a definition that is
    // not the key's variant.
    if (!dtype.ok() || !pass.ok() || !variant || variant->key() != stmt->text_at(12)) return;
    const int64_t batch = stmt->int_at(0), heads_q = stmt->int_at(1), heads_kv = stmt->int_at(2);
    const int64_t seqlen_q = stmt->int_at(3), seqlen_k = stmt->int_at(4);
    const int head_dim = static_cast<int>(stmt->int_at(5));
    const bool causal = stmt->int_at(7) != 0;
    AttentionProblem problem =
        variant->varlen ? AttentionProblem::make_varlen(
                              batch, heads_q, heads_kv, seqlen_q, seqlen_k, variant->total_q,
                              variant->total_k, head_dim, dtype.value(), causal)
                        : AttentionProblem::make(batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                                                 head_dim, dtype.value(), causal);
    problem.variant = *variant;
    problem = problem.with_pass(pass.value());
    problem.deterministic = deterministic_column(problem.pass, stmt->int_at(9) != 0) != 0;
    const int page_size = static_cast<int>(stmt->int_at(10));
    if (page_size > 0) {
      // Enough pages for every sequence's blocks to be distinct.
      const int64_t pages = (seqlen_k + page_size - 1) / page_size;
      problem = problem.with_paged_kv(page_size, batch * pages);
    }
    problem.kv.seqlens_k = problem.kv.seqlens_k || stmt->int_at(11) != 0;
    if (!validate(problem).ok()) return;  // a hand-edited row
    problems.push_back(problem);
  }));
  return problems;
}

}  // namespace flashjit
