#include "runtime/cpu/cpu_info.hpp"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "generator/enum_names.hpp"

namespace flashjit::cpu {
namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

std::string trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t");
  size_t end = text.find_last_not_of(" \t\r\n");
  return begin == std::string::npos ? std::string() : text.substr(begin, end - begin + 1);
}

}  // namespace

const char* to_string(CpuIsa isa) {
  return enum_name(isa, {"sse", "avx2", "avx512", "avx512bf16"}, "?");
}

Result<std::optional<CpuIsa>> isa_cap() {
  static const Result<std::optional<CpuIsa>> cap = parse_isa_cap(std::getenv("FLASHJIT_CPU_ISA"));
  return cap;
}

Result<std::optional<CpuIsa>> parse_isa_cap(const char* value) {
  if (value == nullptr || *value == '\0') return std::optional<CpuIsa>();
  for (CpuIsa isa : {CpuIsa::Sse, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16})
    if (std::string(value) == to_string(isa)) return std::optional<CpuIsa>(isa);
  return make_error(ErrorCode::InvalidArgument,
                    std::string("FLASHJIT_CPU_ISA=") + value +
                        ": not an ISA level; allowed: sse, avx2, avx512, avx512bf16 (or unset)");
}

CpuSpec capped(CpuSpec cpu, CpuIsa cap) {
  if (cap == CpuIsa::Sse) cpu.avx2 = cpu.fma = cpu.f16c = false;
  if (cap == CpuIsa::Sse || cap == CpuIsa::Avx2) cpu.avx512f = false;
  if (cap != CpuIsa::Avx512Bf16) cpu.avx512bf16 = false;
  return cpu;
}

long long parse_cache_size(const std::string& text) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return 0;
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (...) {
    return 0;
  }
  const std::string suffix = text.substr(used);
  if (suffix.empty()) return value;
  if (suffix == "K") return value << 10;
  if (suffix == "M") return value << 20;
  if (suffix == "G") return value << 30;
  return 0;
}

CpuSpec host_cpu() {
  CpuSpec cpu = known_cpu();
  cpu.model = "(unknown)";
  cpu.avx2 = cpu.fma = cpu.f16c = false;
  cpu.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool have_model = false, have_flags = false;
  while (std::getline(cpuinfo, line) && !(have_model && have_flags)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (key == "model name" && !have_model) {
      cpu.model = value;
      have_model = true;
    } else if (key == "flags" && !have_flags) {
      std::istringstream flags(value);
      std::string flag;
      while (flags >> flag) {
        if (flag == "avx2") cpu.avx2 = true;
        if (flag == "avx512f") cpu.avx512f = true;
        if (flag == "avx512_bf16") cpu.avx512bf16 = true;
        if (flag == "fma") cpu.fma = true;
        if (flag == "f16c") cpu.f16c = true;
      }
      have_flags = true;
    }
  }

  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    const std::string level = read_line(dir + "/level");
    if (level.empty()) continue;
    const std::string type = read_line(dir + "/type");
    const long long bytes = parse_cache_size(read_line(dir + "/size"));
    if (bytes <= 0) continue;
    if (level == "1" && type == "Data") cpu.l1d_bytes = bytes;
    if (level == "2" && type != "Instruction") cpu.l2_bytes = bytes;
    if (level == "3" && type != "Instruction") cpu.l3_bytes = bytes;
  }
  const Result<std::optional<CpuIsa>> cap = isa_cap();
  return cap.ok() && cap->has_value() ? capped(cpu, **cap) : cpu;
}

}  // namespace flashjit::cpu
