// hipRTC: HIP source text -> a code object for one AMD target (gfx90a, ...). Needs no GPU.
//
// hipRTC aborts the whole process on some inputs (ROCm 5.2: a target it does not know, such as
// gfx942; an instruction the target lacks: "LLVM ERROR: Cannot select"). So every compile runs in
// a child process, the small `flashjit-hiprtc-worker` executable, which reads one request on
// stdin, compiles in-process and writes one response on stdout; an abort there becomes a
// CompileFailed error here. A dedicated executable started with posix_spawn rather than a fork
// of the caller: callers compile from many threads at once (the tuner, the tests), and a forked
// child of a multithreaded process may only make async-signal-safe calls before exec, which
// hipRTC (dlopen, allocation, locks) is not. The cost is ~0.1 s of process start and library
// loading per compile; compiles of separate kernels run in parallel.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "generator/error.hpp"
#include "generator/render.hpp"
#include "runtime/backend.hpp"

namespace flashjit::hip {

// Options passed to hipRTC for `target` ("gfx90a", or a target ID with features such as
// "gfx90a:sramecc+:xnack-"): --offload-arch, -O3, -std=c++17.
std::vector<std::string> hiprtc_options(const std::string& target);

// One compile, as the worker receives it and answers it. The wire format is a magic line and
// length-prefixed fields ("<key> <bytes>\n<bytes>\n"), so sources and code objects travel
// byte-exact.
struct HiprtcRequest {
  std::string name;  // the program's file name, for messages ("flashjit_attention_fwd.hip")
  std::vector<std::string> options;
  std::string source;
};
struct HiprtcResponse {
  bool compiled = false;
  std::string error;       // why not ("hiprtcCompileProgram: HIPRTC_ERROR_COMPILATION"), if not
  std::string log;         // hipRTC's program log (errors and warnings), may be empty
  std::vector<char> code;  // the code object (an ELF) when compiled
};
std::string encode_request(const HiprtcRequest& request);
Result<HiprtcRequest> decode_request(std::string_view bytes);
std::string encode_response(const HiprtcResponse& response);
Result<HiprtcResponse> decode_response(std::string_view bytes);

// The worker executable: $FLASHJIT_HIPRTC_WORKER if set, else flashjit-hiprtc-worker next to the
// running executable, next to the library holding this code, or where this build put it. Error
// Unsupported naming every place looked at.
Result<std::string> find_worker();

struct HiprtcCompileOptions {
  double timeout_seconds = 300;
  std::string worker;  // empty: find_worker()
};

// Compiles in a worker process. On failure (CompileFailed) the message carries the label, the
// target and the log; when the worker died (an abort in hipRTC), how it died and its last output.
Result<Binary> hiprtc_compile(const KernelSource& source, const std::string& target,
                              const HiprtcCompileOptions& options = {});

// "hiprtc 5.2.21153" (the HIP runtime version the worker's hipRTC belongs to), asked of the
// worker once per process; "hiprtc unavailable (<why>)" when it cannot be.
std::string hiprtc_version();

// What the compiler says a code object's kernel uses, read from its AMDGPU metadata (msgpack
// keys .vgpr_count, .agpr_count, ...); -1 where the code object does not say.
struct CodeObjectResources {
  int vgprs = -1;  // gfx90a+: VGPRs and AGPRs together (the unified register file)
  int agprs = -1;
  int sgprs = -1;
  int vgpr_spills = -1;
  int sgpr_spills = -1;
  int scratch_bytes = -1;  // .private_segment_fixed_size: > 0 means spills or stack in memory
  int lds_bytes = -1;      // static LDS (.group_segment_fixed_size); dynamic LDS comes on top
  int wavefront_size = -1;
};
CodeObjectResources parse_code_object_resources(const std::vector<char>& code);
// The same per kernel of a code object with several (the backward's entry points), in the order
// the metadata lists them; each named by its symbol without ".kd". Kernels are told apart by
// their first metadata key (.agpr_count, present for gfx90a and newer); empty when there is none.
struct KernelResources {
  std::string name;
  CodeObjectResources resources;
};
std::vector<KernelResources> parse_code_object_kernels(const std::vector<char>& code);

// The worker's side: compiles `request` with hipRTC in this process. Only the worker calls it
// (hipRTC may abort the process that calls it).
HiprtcResponse compile_in_this_process(const HiprtcRequest& request);
// The worker's --version line ("hiprtc 5.2.21153"), or why hipRTC cannot be loaded.
Result<std::string> version_in_this_process();

}  // namespace flashjit::hip
