#include "runtime/hip/hiprtc_compiler.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>

#include "runtime/hip/hip_api.hpp"
#include "runtime/subprocess.hpp"

namespace flashjit::hip {
namespace {

constexpr std::string_view kRequestMagic = "flashjit-hiprtc-request 1\n";
constexpr std::string_view kResponseMagic = "flashjit-hiprtc-response 1\n";
constexpr const char* kWorkerName = "flashjit-hiprtc-worker";
// Enough of the worker's stderr to show the compiler's last words, not a whole crash dump.
constexpr size_t kStderrTail = 4000;

void put_field(std::string& out, std::string_view key, std::string_view value) {
  out += key;
  out += ' ';
  out += std::to_string(value.size());
  out += '\n';
  out += value;
  out += '\n';
}

// Reads fields "<key> <length>\n<bytes>\n" after the magic line.
class FieldReader {
 public:
  FieldReader(std::string_view bytes, std::string_view magic, const char* what)
      : bytes_(bytes), what_(what) {
    if (bytes_.substr(0, magic.size()) != magic) {
      error_ = std::string(what_) + ": does not start with '" +
               std::string(magic.substr(0, magic.size() - 1)) + "'";
    } else {
      bytes_.remove_prefix(magic.size());
    }
  }
  const std::string& error() const { return error_; }
  bool done() const { return error_.empty() && bytes_.empty(); }

  // The next field; nullopt at the end or on a malformed field (then error() says why).
  std::optional<std::pair<std::string, std::string_view>> next() {
    if (!error_.empty() || bytes_.empty()) return std::nullopt;
    const size_t space = bytes_.find(' ');
    const size_t newline = bytes_.find('\n');
    if (space == std::string_view::npos || newline == std::string_view::npos || space > newline) {
      return fail("a field header is not '<key> <length>'");
    }
    const std::string key(bytes_.substr(0, space));
    const std::string_view digits = bytes_.substr(space + 1, newline - space - 1);
    if (digits.empty() || digits.size() > 12 ||
        digits.find_first_not_of("0123456789") != std::string_view::npos) {
      return fail("field '" + key + "' has a bad length");
    }
    const size_t length = std::stoull(std::string(digits));
    bytes_.remove_prefix(newline + 1);
    if (bytes_.size() < length + 1 || bytes_[length] != '\n') {
      return fail("field '" + key + "' is truncated");
    }
    const std::string_view value = bytes_.substr(0, length);
    bytes_.remove_prefix(length + 1);
    return std::make_pair(key, value);
  }

 private:
  std::nullopt_t fail(const std::string& why) {
    error_ = std::string(what_) + ": " + why;
    return std::nullopt;
  }
  std::string_view bytes_;
  const char* what_;
  std::string error_;
};

bool executable(const std::filesystem::path& path) {
  std::error_code ignored;
  return std::filesystem::is_regular_file(path, ignored) && ::access(path.c_str(), X_OK) == 0;
}

std::string tail(const std::string& text, size_t bytes) {
  if (text.size() <= bytes) return text;
  return "..." + text.substr(text.size() - bytes);
}

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0'))
    text.pop_back();
  return text;
}

// The unsigned msgpack integer at bytes[at], or -1 if there is none.
long long msgpack_uint(const std::vector<char>& bytes, size_t at) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  if (at >= bytes.size()) return -1;
  const unsigned char tag = byte(at);
  if (tag <= 0x7f) return tag;  // positive fixint
  int width = tag == 0xcc ? 1 : tag == 0xcd ? 2 : tag == 0xce ? 4 : 0;
  if (width == 0 || at + width >= bytes.size()) return -1;
  long long value = 0;
  for (int i = 1; i <= width; ++i) value = (value << 8) | byte(at + i);  // big-endian
  return value;
}

// A msgpack string key (encoded as a fixstr).
std::string msgpack_key(std::string_view key) {
  std::string pattern(1, static_cast<char>(0xa0 | key.size()));
  pattern += key;
  return pattern;
}

// The value of msgpack string key `key` followed by an unsigned integer, first found in
// code[begin, end).
int metadata_int(const std::vector<char>& code, std::string_view key, size_t begin = 0,
                 size_t end = std::string_view::npos) {
  const std::string pattern = msgpack_key(key);
  const std::string_view haystack(code.data(), std::min(end, code.size()));
  const size_t found = haystack.find(pattern, begin);
  if (found == std::string_view::npos) return -1;
  const long long value = msgpack_uint(code, found + pattern.size());
  return value < 0 || value > (1ll << 30) ? -1 : static_cast<int>(value);
}

// The msgpack string (fixstr or str8) at code[at], or "" if there is none.
std::string msgpack_string(const std::vector<char>& code, size_t at) {
  if (at >= code.size()) return "";
  const unsigned char tag = static_cast<unsigned char>(code[at]);
  size_t length = 0, start = at + 1;
  if ((tag & 0xe0) == 0xa0) {
    length = tag & 0x1f;
  } else if (tag == 0xd9 && at + 1 < code.size()) {
    length = static_cast<unsigned char>(code[at + 1]);
    start = at + 2;
  } else {
    return "";
  }
  if (start + length > code.size()) return "";
  return std::string(code.data() + start, length);
}

CodeObjectResources resources_in(const std::vector<char>& code, size_t begin, size_t end) {
  CodeObjectResources r;
  r.vgprs = metadata_int(code, ".vgpr_count", begin, end);
  r.agprs = metadata_int(code, ".agpr_count", begin, end);
  r.sgprs = metadata_int(code, ".sgpr_count", begin, end);
  r.vgpr_spills = metadata_int(code, ".vgpr_spill_count", begin, end);
  r.sgpr_spills = metadata_int(code, ".sgpr_spill_count", begin, end);
  r.scratch_bytes = metadata_int(code, ".private_segment_fixed_size", begin, end);
  r.lds_bytes = metadata_int(code, ".group_segment_fixed_size", begin, end);
  r.wavefront_size = metadata_int(code, ".wavefront_size", begin, end);
  return r;
}

}  // namespace

std::vector<std::string> hiprtc_options(const std::string& target) {
  return {"--offload-arch=" + target, "-O3", "-std=c++17"};
}

std::string encode_request(const HiprtcRequest& request) {
  std::string out(kRequestMagic);
  put_field(out, "name", request.name);
  for (const std::string& option : request.options) put_field(out, "option", option);
  put_field(out, "source", request.source);
  return out;
}

Result<HiprtcRequest> decode_request(std::string_view bytes) {
  FieldReader reader(bytes, kRequestMagic, "hipRTC request");
  HiprtcRequest request;
  bool has_source = false;
  while (auto field = reader.next()) {
    if (field->first == "name") {
      request.name = field->second;
    } else if (field->first == "option") {
      request.options.emplace_back(field->second);
    } else if (field->first == "source") {
      request.source = field->second;
      has_source = true;
    } else {
      return make_error(ErrorCode::InvalidArgument,
                        "hipRTC request: unknown field '" + field->first + "'");
    }
  }
  if (!reader.error().empty()) return make_error(ErrorCode::InvalidArgument, reader.error());
  if (!has_source) return make_error(ErrorCode::InvalidArgument, "hipRTC request: no source");
  return request;
}

std::string encode_response(const HiprtcResponse& response) {
  std::string out(kResponseMagic);
  put_field(out, "status", response.compiled ? "compiled" : "failed");
  put_field(out, "error", response.error);
  put_field(out, "log", response.log);
  put_field(out, "code", std::string_view(response.code.data(), response.code.size()));
  return out;
}

Result<HiprtcResponse> decode_response(std::string_view bytes) {
  FieldReader reader(bytes, kResponseMagic, "hipRTC response");
  HiprtcResponse response;
  bool has_status = false;
  while (auto field = reader.next()) {
    if (field->first == "status") {
      if (field->second != "compiled" && field->second != "failed") {
        return make_error(ErrorCode::CompileFailed,
                          "hipRTC response: bad status '" + std::string(field->second) + "'");
      }
      response.compiled = field->second == "compiled";
      has_status = true;
    } else if (field->first == "error") {
      response.error = field->second;
    } else if (field->first == "log") {
      response.log = field->second;
    } else if (field->first == "code") {
      response.code.assign(field->second.begin(), field->second.end());
    } else {
      return make_error(ErrorCode::CompileFailed,
                        "hipRTC response: unknown field '" + field->first + "'");
    }
  }
  if (!reader.error().empty()) return make_error(ErrorCode::CompileFailed, reader.error());
  if (!has_status) return make_error(ErrorCode::CompileFailed, "hipRTC response: no status");
  return response;
}

Result<std::string> find_worker() {
  std::vector<std::filesystem::path> candidates;
  if (const char* env = std::getenv("FLASHJIT_HIPRTC_WORKER"); env != nullptr && *env != '\0') {
    // An explicit choice is the only one: a wrong path should be an error, not a fallback.
    if (executable(env)) return std::string(env);
    return make_error(ErrorCode::Unsupported, std::string("FLASHJIT_HIPRTC_WORKER = '") + env +
                                                  "': not an executable file");
  }
  std::error_code ignored;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ignored);
  if (!self.empty()) candidates.push_back(self.parent_path() / kWorkerName);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&find_worker), &info) != 0 && info.dli_fname != nullptr) {
    candidates.push_back(std::filesystem::path(info.dli_fname).parent_path() / kWorkerName);
  }
#ifdef FLASHJIT_HIPRTC_WORKER_PATH
  candidates.emplace_back(FLASHJIT_HIPRTC_WORKER_PATH);
#endif
  std::string looked;
  for (const std::filesystem::path& candidate : candidates) {
    if (executable(candidate)) return candidate.string();
    looked += (looked.empty() ? "" : ", ") + candidate.string();
  }
  return make_error(ErrorCode::Unsupported,
                    std::string(kWorkerName) + " not found (looked at " + looked +
                        "); build it with the HIP backend or set FLASHJIT_HIPRTC_WORKER");
}

Result<Binary> hiprtc_compile(const KernelSource& source, const std::string& target,
                              const HiprtcCompileOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::string worker = options.worker;
  if (worker.empty()) {
    Result<std::string> found = find_worker();
    if (!found.ok()) return found.error();
    worker = found.value();
  }
  HiprtcRequest request;
  request.name = (source.entries.empty() ? std::string("kernel") : source.entry()) + ".hip";
  request.options = hiprtc_options(target);
  request.source = source.text;
  Result<ProcessResult> ran =
      run_process({worker}, encode_request(request), options.timeout_seconds);
  if (!ran.ok()) {
    return make_error(ErrorCode::CompileFailed, "hipRTC worker for '" + source.label +
                                                    "' could not start: " + ran.error().message);
  }
  const ProcessResult& process = ran.value();
  std::string what = "hipRTC compile of '";
  what += source.label;
  what += "' for ";
  what += target;
  if (!process.exited_ok()) {
    std::string message = what + " crashed: the compile worker (" + worker + ") was " +
                          process.how_it_ended(options.timeout_seconds) + ".";
    if (process.signal != 0) {
      message +=
          " hipRTC aborts on targets this ROCm does not know (ROCm 5.2 knows gfx90a but "
          "not gfx940-942: MI300 needs ROCm >= 5.7) and on instructions the target "
          "lacks.";
    }
    const std::string err = trimmed(process.err);
    if (!err.empty()) message += " Worker stderr:\n" + tail(err, kStderrTail);
    return make_error(ErrorCode::CompileFailed, std::move(message));
  }
  Result<HiprtcResponse> response = decode_response(process.out);
  if (!response.ok()) {
    return make_error(ErrorCode::CompileFailed, what + ": unreadable worker answer (" +
                                                    response.error().message + ")" +
                                                    (process.err.empty() ? "" : "\n") +
                                                    tail(trimmed(process.err), kStderrTail));
  }
  if (!response->compiled) {
    std::string options_text;
    for (const std::string& option : request.options) options_text += " " + option;
    std::string message = what + " failed: " + response->error + "\noptions:" + options_text;
    const std::string log = trimmed(response->log);
    if (!log.empty()) message += "\n" + log;
    return make_error(ErrorCode::CompileFailed, std::move(message));
  }
  if (response->code.empty()) {
    return make_error(ErrorCode::CompileFailed, what + ": hipRTC returned an empty code object");
  }
  Binary binary;
  binary.bytes = std::move(response->code);
  binary.compile_log = trimmed(response->log);
  binary.compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return binary;
}

std::string hiprtc_version() {
  static const std::string version = [] {
    Result<std::string> worker = find_worker();
    if (!worker.ok()) return "hiprtc unavailable (" + worker.error().message + ")";
    Result<ProcessResult> ran = run_process({worker.value(), "--version"}, "", 60);
    if (!ran.ok()) return "hiprtc unavailable (" + ran.error().message + ")";
    if (!ran->exited_ok()) return "hiprtc unavailable (" + trimmed(ran->err) + ")";
    return trimmed(ran->out);
  }();
  return version;
}

CodeObjectResources parse_code_object_resources(const std::vector<char>& code) {
  return resources_in(code, 0, code.size());
}

std::vector<KernelResources> parse_code_object_kernels(const std::vector<char>& code) {
  // A kernel's metadata map starts with its alphabetically first key: from one .agpr_count to
  // the next is one kernel's.
  const std::string first_key = msgpack_key(".agpr_count");
  const std::string symbol_key = msgpack_key(".symbol");
  const std::string_view haystack(code.data(), code.size());
  std::vector<size_t> starts;
  for (size_t at = haystack.find(first_key); at != std::string_view::npos;
       at = haystack.find(first_key, at + 1))
    starts.push_back(at);
  std::vector<KernelResources> kernels;
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t end = i + 1 < starts.size() ? starts[i + 1] : code.size();
    KernelResources kernel;
    const size_t symbol = haystack.substr(0, end).find(symbol_key, starts[i]);
    if (symbol != std::string_view::npos) {
      kernel.name = msgpack_string(code, symbol + symbol_key.size());
      if (kernel.name.size() > 3 && kernel.name.compare(kernel.name.size() - 3, 3, ".kd") == 0)
        kernel.name.resize(kernel.name.size() - 3);
    }
    kernel.resources = resources_in(code, starts[i], end);
    kernels.push_back(std::move(kernel));
  }
  return kernels;
}

// ---- the worker's side --------------------------------------------------------------------------

Result<std::string> version_in_this_process() {
  Result<const Rtc*> loaded = rtc();
  if (!loaded.ok()) return loaded.error();
  const int v = loaded.value()->runtime_version;
  if (v <= 0) return std::string("hiprtc (") + loaded.value()->library + ")";
  // HIP_VERSION = major * 10000000 + minor * 100000 + patch.
  return "hiprtc " + std::to_string(v / 10000000) + "." + std::to_string(v / 100000 % 100) + "." +
         std::to_string(v % 100000);
}

HiprtcResponse compile_in_this_process(const HiprtcRequest& request) {
  HiprtcResponse response;
  Result<const Rtc*> loaded = rtc();
  if (!loaded.ok()) {
    response.error = loaded.error().message;
    return response;
  }
  const Rtc& rtc = *loaded.value();
  auto name_of = [&](hiprtcResult result) {
    const char* text = rtc.hiprtcGetErrorString(result);
    return text != nullptr ? std::string(text)
                           : "hiprtcResult " + std::to_string(static_cast<int>(result));
  };
  hiprtcProgram program = nullptr;
  hiprtcResult result = rtc.hiprtcCreateProgram(&program, request.source.c_str(),
                                                request.name.c_str(), 0, nullptr, nullptr);
  if (result != HIPRTC_SUCCESS) {
    response.error = "hiprtcCreateProgram: " + name_of(result);
    return response;
  }
  std::vector<const char*> options;
  for (const std::string& option : request.options) options.push_back(option.c_str());
  const hiprtcResult compiled =
      rtc.hiprtcCompileProgram(program, static_cast<int>(options.size()), options.data());
  size_t log_size = 0;
  if (rtc.hiprtcGetProgramLogSize(program, &log_size) == HIPRTC_SUCCESS && log_size > 0) {
    std::string log(log_size, '\0');
    if (rtc.hiprtcGetProgramLog(program, log.data()) == HIPRTC_SUCCESS) response.log = log;
  }
  if (compiled != HIPRTC_SUCCESS) {
    response.error = "hiprtcCompileProgram: " + name_of(compiled);
  } else {
    size_t code_size = 0;
    result = rtc.hiprtcGetCodeSize(program, &code_size);
    if (result == HIPRTC_SUCCESS) {
      response.code.resize(code_size);
      result = rtc.hiprtcGetCode(program, response.code.data());
    }
    if (result != HIPRTC_SUCCESS) {
      response.error = "hiprtcGetCode: " + name_of(result);
      response.code.clear();
    } else {
      response.compiled = true;
    }
  }
  rtc.hiprtcDestroyProgram(&program);
  return response;
}

}  // namespace flashjit::hip
