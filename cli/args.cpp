#include "cli/args.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>
#include <system_error>
#include <vector>

namespace flashjit::cli {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// "--name". Built by append: gcc 12 warns falsely (-Wrestrict, PR 105329) on "--" + string&&.
std::string dashed(std::string_view name) {
  std::string out("--");
  out.append(name);
  return out;
}

Error flag_error(std::string_view name, std::string_view value, std::string_view allowed) {
  std::string message = dashed(name);
  message += " = '" + std::string(value) + "': " + std::string(allowed);
  return make_error(ErrorCode::InvalidArgument, std::move(message));
}

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

// The flag sets the commands share.
const Flag kHelpFlag{"help", "", "print this help and exit"};

std::vector<Flag> problem_flags() {
  std::vector<Flag> flags = {
      {"batch", "N", "batch size (default 2)"},
      {"heads", "N", "query heads (default 16)"},
      {"kv-heads", "N", "key/value heads, dividing --heads (default: --heads; 1 = MQA)"},
      {"seqlen", "N", "query and key sequence length (default 4096)"},
      {"seqlen-q", "N", "query sequence length (overrides --seqlen)"},
      {"seqlen-k", "N", "key/value sequence length (overrides --seqlen)"},
      {"head-dim", "D", "head dimension, a multiple of 8 in [8, 256] (default 128)"},
      {"dtype", "T", "bf16, fp16 or fp32 (fp32: CPU backend only; default bf16)"},
      {"causal", "", "causal mask, aligned bottom-right as in FlashAttention-2"},
      {"scale", "X", "softmax scale, a finite number > 0 (default 1/sqrt(head-dim))"},
      {"layout", "L", "bshd or bhsd, contiguous (default bshd)"},
      {"pass", "P",
       "fwd (forward, the default) or bwd (backward: dq, dk, dv from q, k, v, o, "
       "lse and do)"},
      {"deterministic", "",
       "with --pass bwd: bitwise reproducible gradients (separate dQ kernel configs only)"},
      {"page-size", "N",
       "paged K/V cache (the -decode family): keys per page, a multiple of 16 in [16, 256]; "
       "one cache holding every sequence's pages, key counts per sequence (seqlens_k)"},
  };
  for (const Flag& flag : variant_flags()) flags.push_back(flag);
  flags.push_back({"docs", "L1,L2,...",
                   "packed variable-length documents (cu_seqlens) of these lengths, queries and "
                   "keys alike (replaces --batch and --seqlen: num_docs, the longest, the "
                   "total); run launches these documents (tune times documents of the same count "
                   "and total split evenly: the offsets are launch data)"});
  return flags;
}

std::vector<Flag> with(std::vector<Flag> flags, std::initializer_list<Flag> more) {
  flags.insert(flags.end(), more.begin(), more.end());
  flags.push_back(kHelpFlag);
  return flags;
}

const Flag kArchFlag{"arch", "ARCH",
                     "plan for a table architecture: sm80, sm86, sm89, sm90, gfx90a, gfx942, or "
                     "cpu (this host)"};
const Flag kBackendFlag{"backend", "B",
                        "auto, cuda, hip or cpu (default: $FLASHJIT_BACKEND or auto: CUDA device "
                        "0 if present, else an AMD GPU, else the CPU)"};
const Flag kDeviceFlag{"device", "N",
                       "plan for GPU N (CUDA; HIP with --backend hip; default: device 0)"};
const Flag kConfigFlag{"config", "CFG", "tile config, e.g. m128n64w4s2 (default: default_config)"};
const Flag kSplitsFlag{"splits", "S",
                       "auto or N in [1, 128]: key ranges per sequence of a -decode config "
                       "(--config's or the default's)"};

}  // namespace

std::optional<std::string> ParsedFlags::get(std::string_view name) const {
  auto it = values.find(name);
  if (it == values.end()) return std::nullopt;
  return it->second;
}

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"plan", "print the SRAM budget arithmetic and the legal tile configs",
       "Prints how the shared-memory and register budget of the device decides which tile\n"
       "configs are legal for the problem, the legal set, and the default config; with --pass\n"
       "bwd those of the backward pass. Without --arch or --device it uses CUDA device 0, if\n"
       "there is one.",
       with(problem_flags(), {kArchFlag, kDeviceFlag, kBackendFlag})},
      {"show", "print the rendered source of a kernel (CUDA, HIP or C++)",
       "Prints the kernel source rendered for the problem and config to stdout (a header line\n"
       "naming problem, config, device and entry points goes to stderr). --pass bwd: the\n"
       "backward pass's source (its preprocess, dK/dV and dQ entry points).",
       with(problem_flags(), {kConfigFlag, kSplitsFlag, kArchFlag, kDeviceFlag, kBackendFlag})},
      {"compile", "compile kernels with NVRTC or hipRTC (no GPU needed), report resources",
       "Compiles the default config (or --config, or every legal config with --all) to CUBIN\n"
       "(NVRTC) or to an AMD code object (hipRTC, for --arch gfx90a/gfx942) for the\n"
       "architecture and prints shared memory, estimated and compiler register counts,\n"
       "spills and compile time (--pass bwd: the backward's configs, the worst of its\n"
       "kernels). Exit status 1 if any compile fails.",
       with(problem_flags(), {kConfigFlag,
                              kSplitsFlag,
                              kArchFlag,
                              kDeviceFlag,
                              {"all", "", "compile every legal config"},
                              {"jobs", "N", "parallel compiles (default: number of CPU cores)"}})},
      {"run", "build and time a kernel on the GPU (or the CPU)",
       "Builds the kernel through the Runtime (on-disk cache: $FLASHJIT_CACHE_DIR), runs it\n"
       "on random inputs and prints the median time and TFLOP/s. --pass bwd: random q, k, v\n"
       "and dO, o and lse from a forward launch; times the backward alone, the forward and\n"
       "forward + backward (TFLOP/s by the FlashAttention convention: the backward counts\n"
       "2.5x and forward + backward 3.5x the forward's FLOPs). --config is the config of the\n"
       "pass asked for (the other pass uses the runtime's choice). Correctness is checked by\n"
       "the tests, not here. Exit status 2 if there is no device.",
       with(problem_flags(),
            {kConfigFlag,
             kSplitsFlag,
             kBackendFlag,
             {"device", "N", "CUDA or HIP device ordinal (default 0)"},
             {"reps", "N", "timed repetitions, the median is reported (default 20)"}})},
      {"devices", "list CUDA and AMD devices, the host CPU and the known table architectures",
       "Lists the CUDA and AMD (HIP) devices with their limits, or says why there is none,\n"
       "and the architectures `--arch` accepts.",
       with({}, {})},
  };
  return kCommands;
}

const Command* find_command(std::string_view name) {
  for (const Command& command : commands()) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

Result<ParsedFlags> parse_flags(const Command& command, const std::vector<std::string>& args) {
  ParsedFlags parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (arg == "-h") arg = "--help";
    if (arg.size() < 3 || arg.substr(0, 2) != "--") {
      return make_error(ErrorCode::InvalidArgument, "unexpected argument '" + std::string(arg) +
                                                        "' for '" + std::string(command.name) +
                                                        "': flags start with --; see flashjit " +
                                                        std::string(command.name) + " --help");
    }
    std::string_view body = arg.substr(2);
    std::optional<std::string> inline_value;
    if (size_t eq = body.find('='); eq != std::string_view::npos) {
      inline_value = std::string(body.substr(eq + 1));
      body = body.substr(0, eq);
    }
    const Flag* flag = nullptr;
    for (const Flag& candidate : command.flags) {
      if (candidate.name == body) flag = &candidate;
    }
    if (flag == nullptr) {
      std::vector<std::string> allowed;
      for (const Flag& candidate : command.flags) allowed.push_back(dashed(candidate.name));
      return make_error(ErrorCode::InvalidArgument, "unknown flag " + dashed(body) + " for '" +
                                                        std::string(command.name) +
                                                        "'; allowed: " + join(allowed, ", "));
    }
    if (parsed.has(flag->name)) {
      return make_error(ErrorCode::InvalidArgument, dashed(flag->name) + " given more than once");
    }
    std::string value;
    if (flag->is_switch()) {
      if (inline_value) {
        return flag_error(flag->name, *inline_value, "this switch takes no value");
      }
    } else if (inline_value) {
      value = *inline_value;
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return make_error(ErrorCode::InvalidArgument,
                        dashed(flag->name) + " needs a value (" + std::string(flag->metavar) + ")");
    }
    parsed.values.emplace(std::string(flag->name), std::move(value));
  }
  return parsed;
}

Result<int64_t> integer_flag(const ParsedFlags& flags, std::string_view name, int64_t fallback,
                             int64_t min_value, int64_t max_value) {
  std::optional<std::string> text = flags.get(name);
  if (!text) return fallback;
  int64_t value = 0;
  const char* begin = text->data();
  const char* end = begin + text->size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  bool in_range = ec == std::errc() && ptr == end && value >= min_value && value <= max_value;
  if (!in_range) {
    return flag_error(name, *text,
                      "must be an integer in [" + std::to_string(min_value) + ", " +
                          std::to_string(max_value) + "]");
  }
  return value;
}

std::vector<Flag> variant_flags() {
  return {
      {"window", "L,R",
       "sliding window: keys up to L before and R after the (bottom-right) diagonal; -1 for "
       "an unbounded side (with --causal R is 0)"},
      {"softcap", "C", "soft-capping: scores become C * tanh(score / C); C finite and > 0"},
      {"alibi", "", "ALiBi: score += slope[head] * (kv_idx - q_idx), the standard slopes"},
      {"prefix", "P", "prefix-LM: keys [0, P) visible to every query"},
      {"score-mod", "EXPR",
       "a C++ float expression over score, batch, head, q_idx, kv_idx, compiled into the kernel "
       "(e.g. 'score - 0.1f * abs(q_idx - kv_idx)')"},
      {"mask-mod", "EXPR",
       "a C++ bool expression over batch, head, q_idx, kv_idx: which keys a query sees"},
      {"score-mod-grad", "EXPR",
       "with --score-mod and --pass bwd (required there): d score_mod / d score, a C++ float "
       "expression over the same variables (score: score_mod's input), e.g. '1.0f'"},
  };
}

Status apply_variant_flags(const ParsedFlags& flags, Variant& variant) {
  if (auto text = flags.get("window")) {
    const size_t comma = text->find(',');
    int64_t sides[2] = {0, 0};
    bool ok = comma != std::string::npos;
    for (int i = 0; ok && i < 2; ++i) {
      const char* begin = text->data() + (i == 0 ? 0 : comma + 1);
      const char* end = text->data() + (i == 0 ? comma : text->size());
      auto [ptr, ec] = std::from_chars(begin, end, sides[i]);
      ok = ec == std::errc() && ptr == end && sides[i] >= -1 && sides[i] <= kMaxInt32;
    }
    if (!ok)
      return flag_error("window", *text,
                        "must be L,R: keys before and after the diagonal, each -1 (unbounded) or "
                        "an integer in [0, 2147483647]");
    variant.window_left = sides[0];
    variant.window_right = sides[1];
  }
  if (auto text = flags.get("softcap")) {
    float cap = 0;
    auto [ptr, ec] = std::from_chars(text->data(), text->data() + text->size(), cap);
    if (ec != std::errc() || ptr != text->data() + text->size() || !std::isfinite(cap) || cap <= 0)
      return flag_error("softcap", *text, "must be a finite number > 0");
    variant.softcap = cap;
  }
  variant.alibi = flags.has("alibi");
  if (flags.get("prefix")) {
    auto prefix = integer_flag(flags, "prefix", 0, 0, kMaxInt32);
    FLASHJIT_TRY(prefix);
    variant.prefix = *prefix;
  }
  if (auto text = flags.get("score-mod")) variant.score_mod = *text;
  if (auto text = flags.get("mask-mod")) variant.mask_mod = *text;
  if (auto text = flags.get("score-mod-grad")) variant.score_mod_grad = *text;
  return ok_status();
}

Result<std::vector<int32_t>> document_offsets_from_flags(const ParsedFlags& flags) {
  std::vector<int32_t> offsets;
  std::optional<std::string> text = flags.get("docs");
  if (!text) return offsets;
  int64_t total = 0;
  offsets.push_back(0);
  for (size_t begin = 0; begin <= text->size();) {
    size_t end = text->find(',', begin);
    if (end == std::string::npos) end = text->size();
    int64_t length = -1;
    auto [ptr, ec] = std::from_chars(text->data() + begin, text->data() + end, length);
    if (ec != std::errc() || ptr != text->data() + end || length < 0 || length > kMaxInt32 ||
        (total += length) > kMaxInt32)
      return flag_error("docs", *text,
                        "must be document lengths L1,L2,... (integers >= 0, at most 2147483647 "
                        "in all)");
    offsets.push_back(static_cast<int32_t>(total));
    begin = end + 1;
  }
  return offsets;
}

namespace {

// --docs L1,L2,...: `problem` made a problem of packed documents of those lengths (queries and
// keys alike), its other fields as they are.
Status apply_docs_flag(const ParsedFlags& flags, AttentionProblem& problem) {
  if (!flags.has("docs")) return ok_status();
  if (problem.kv.paged())
    return make_error(ErrorCode::InvalidArgument, "--docs and --page-size do not combine");
  Result<std::vector<int32_t>> offsets = document_offsets_from_flags(flags);
  FLASHJIT_TRY(offsets);
  int64_t longest = 1;
  for (size_t i = 1; i < offsets->size(); ++i)
    longest = std::max<int64_t>(longest, (*offsets)[i] - (*offsets)[i - 1]);
  const int64_t total = std::max<int64_t>(1, offsets->back());
  const int64_t documents = static_cast<int64_t>(offsets->size()) - 1;
  AttentionProblem packed =
      AttentionProblem::make_varlen(documents, problem.heads_q, problem.heads_kv, longest, longest,
                                    total, total, problem.head_dim, problem.dtype, problem.causal);
  packed.pass = problem.pass;
  packed.variant = problem.variant;  // the other variant flags', then the documents'
  packed.variant.varlen = true;
  packed.variant.total_q = packed.variant.total_k = total;
  problem = packed;
  return ok_status();
}

}  // namespace

Status apply_page_size_flag(const ParsedFlags& flags, AttentionProblem& problem) {
  std::optional<std::string> text = flags.get("page-size");
  if (!text) return ok_status();
  auto page = integer_flag(flags, "page-size", 0, kMinPageSize, kMaxPageSize);
  FLASHJIT_TRY(page);
  if (*page % 16 != 0)
    return flag_error("page-size", *text,
                      "must be a multiple of 16 in [" + std::to_string(kMinPageSize) + ", " +
                          std::to_string(kMaxPageSize) + "]");
  if (problem.is_backward())
    return make_error(ErrorCode::InvalidArgument,
                      "--page-size applies to the forward pass only (a paged K/V cache)");
  const int64_t pages_per_sequence = (problem.seqlen_k + *page - 1) / *page;
  problem = problem.with_paged_kv(static_cast<int>(*page), problem.batch * pages_per_sequence);
  return ok_status();
}

Result<AttentionProblem> problem_from_flags(const ParsedFlags& flags) {
  auto batch = integer_flag(flags, "batch", kDefaultBatch, 1, kMaxInt32);
  FLASHJIT_TRY(batch);
  auto heads = integer_flag(flags, "heads", kDefaultHeads, 1, kMaxInt32);
  FLASHJIT_TRY(heads);
  auto kv_heads = integer_flag(flags, "kv-heads", *heads, 1, *heads);
  FLASHJIT_TRY(kv_heads);
  if (*heads % *kv_heads != 0) {
    return flag_error("kv-heads", *flags.get("kv-heads"),
                      "must divide --heads = " + std::to_string(*heads));
  }
  auto seqlen = integer_flag(flags, "seqlen", kDefaultSeqlen, 1, kMaxInt32);
  FLASHJIT_TRY(seqlen);
  auto seqlen_q = integer_flag(flags, "seqlen-q", *seqlen, 1, kMaxInt32);
  FLASHJIT_TRY(seqlen_q);
  auto seqlen_k = integer_flag(flags, "seqlen-k", *seqlen, 1, kMaxInt32);
  FLASHJIT_TRY(seqlen_k);
  auto head_dim = integer_flag(flags, "head-dim", kDefaultHeadDim, kMinHeadDim, kMaxHeadDim);
  FLASHJIT_TRY(head_dim);
  if (*head_dim % 8 != 0) {
    return flag_error("head-dim", *flags.get("head-dim"),
                      "must be a multiple of 8 in [" + std::to_string(kMinHeadDim) + ", " +
                          std::to_string(kMaxHeadDim) + "]");
  }

  DType dtype = DType::BF16;
  if (auto text = flags.get("dtype")) {
    // parse_dtype accepts the long spellings too; the message lists the short ones.
    auto parsed = parse_dtype(*text);
    if (!parsed.ok()) return flag_error("dtype", *text, "allowed: bf16, fp16, fp32");
    dtype = *parsed;
  }

  Layout layout = Layout::BSHD;
  if (auto text = flags.get("layout")) {
    if (*text == "bshd" || *text == "BSHD") {
      layout = Layout::BSHD;
    } else if (*text == "bhsd" || *text == "BHSD") {
      layout = Layout::BHSD;
    } else {
      return flag_error("layout", *text, "allowed: bshd, bhsd");
    }
  }

  AttentionProblem problem =
      AttentionProblem::make(*batch, *heads, *kv_heads, *seqlen_q, *seqlen_k,
                             static_cast<int>(*head_dim), dtype, flags.has("causal"), layout);

  if (auto text = flags.get("pass")) {
    auto pass = parse_pass(*text);
    if (!pass.ok()) return flag_error("pass", *text, "allowed: fwd, bwd");
    problem.pass = *pass;
  }
  if (flags.has("deterministic")) {
    if (!problem.is_backward()) {
      return make_error(ErrorCode::InvalidArgument,
                        "--deterministic applies to the backward pass only: add --pass bwd");
    }
    problem.deterministic = true;
  }

  FLASHJIT_TRY(apply_page_size_flag(flags, problem));
  FLASHJIT_TRY(apply_variant_flags(flags, problem.variant));
  FLASHJIT_TRY(apply_docs_flag(flags, problem));

  if (auto text = flags.get("scale")) {
    float scale = 0;
    const char* begin = text->data();
    const char* end = begin + text->size();
    auto [ptr, ec] = std::from_chars(begin, end, scale);
    if (ec != std::errc() || ptr != end || !std::isfinite(scale) || scale <= 0) {
      return flag_error("scale", *text, "must be a finite number > 0");
    }
    problem.softmax_scale = scale;
  }

  FLASHJIT_TRY(validate(problem));
  return problem;
}

Status apply_splits_flag(const ParsedFlags& flags, AttentionConfig& config) {
  std::optional<std::string> text = flags.get("splits");
  if (!text) return ok_status();
  int splits = 0;
  if (*text != "auto") {
    auto value = integer_flag(flags, "splits", 0, 1, 128);
    FLASHJIT_TRY(value);
    splits = static_cast<int>(*value);
  }
  if (config.family != KernelFamily::Decode)
    return flag_error("splits", *text,
                      "applies to -decode configs; " + config.to_string() +
                          " is not one (a decode problem: --seqlen-q 1..16 with --seqlen-k >= "
                          "128, or --page-size)");
  config.splits = splits;
  return ok_status();
}

Result<std::optional<AttentionConfig>> config_from_flags(const ParsedFlags& flags) {
  std::optional<std::string> text = flags.get("config");
  if (!text) return std::optional<AttentionConfig>();
  auto config = AttentionConfig::parse(*text);
  if (!config.ok()) {
    // The parser's message already reads "config = '<text>': ..."; name the flag instead.
    const std::string& message = config.error().message;
    if (message.rfind("config = ", 0) == 0) {
      return make_error(ErrorCode::InvalidArgument, dashed(message));
    }
    return flag_error("config", *text, message);
  }
  return std::optional<AttentionConfig>(*config);
}

Result<std::optional<DeviceSpec>> table_device_from_flags(const ParsedFlags& flags) {
  std::optional<std::string> text = flags.get("arch");
  if (!text) return std::optional<DeviceSpec>();
  if (flags.has("device")) {
    return make_error(ErrorCode::InvalidArgument, "--arch and --device exclude each other");
  }
  auto device = known_device(*text);
  if (!device.ok()) {
    return flag_error("arch", *text, "allowed: " + join(known_archs(), ", "));
  }
  return std::optional<DeviceSpec>(*device);
}

std::string program_usage() {
  std::ostringstream out;
  out << "flashjit: run-time compiled, autotuned FlashAttention (forward and backward) for NVIDIA\n"
      << "and AMD GPUs and the CPU\n\n"
      << "usage: flashjit <command> [flags]\n"
      << "       flashjit <command> --help\n"
      << "       flashjit --version\n\n"
      << "commands:\n";
  for (const Command& command : commands()) {
    std::string name(command.name);
    name.resize(10, ' ');
    out << "  " << name << command.summary << "\n";
  }
  out << "  tune      measure every legal config of a grid of problems, store the best\n"
      << "  db        list, show, export, import, merge or clear tuning databases\n"
      << "  report    one self-contained HTML report of a tuning DB (and a side-by-side run)\n";
  out << "\nenvironment:\n"
      << "  FLASHJIT_CACHE_DIR  where compiled kernels are cached (default ~/.cache/flashjit)\n"
      << "  FLASHJIT_DB         the user tuning DB (default ~/.local/share/flashjit/tuning.db)\n"
      << "  FLASHJIT_SYSTEM_DB  read-only tuning DBs under the user DB, ':'-separated\n"
      << "  FLASHJIT_TUNE=1     tune a problem the DBs do not know on first use\n"
      << "  FLASHJIT_LOG=1      log each kernel selection to stderr\n";
  return out.str();
}

std::string command_usage(const Command& command) {
  std::ostringstream out;
  out << "usage: flashjit " << command.name << " [flags]\n\n" << command.details << "\n\nflags:\n";
  for (const Flag& flag : command.flags) {
    std::string left = dashed(flag.name);
    if (!flag.is_switch()) left.append(" ").append(flag.metavar);
    if (left.size() < 18) left.resize(18, ' ');
    out << "  " << left << "  " << flag.help << "\n";
  }
  return out.str();
}

}  // namespace flashjit::cli
