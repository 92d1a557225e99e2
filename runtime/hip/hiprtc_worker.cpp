// flashjit-hiprtc-worker: compiles one HIP source with hipRTC, in its own process, so that a
// hipRTC abort ends this process and not the caller's (see runtime/hip/hiprtc_compiler.hpp).
//
//   flashjit-hiprtc-worker            reads a request (encode_request) on stdin, writes a
//                                     response (encode_response) on stdout; exit status 0 when
//                                     it answered (compiled or not), 2 for an unreadable request
//   flashjit-hiprtc-worker --version  prints "hiprtc 5.2.21153"; exit status 1 without hipRTC
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "runtime/hip/hiprtc_compiler.hpp"

namespace {

bool write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flashjit::hip;
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    flashjit::Result<std::string> version = version_in_this_process();
    if (!version.ok()) {
      std::fprintf(stderr, "%s\n", version.error().message.c_str());
      return 1;
    }
    std::printf("%s\n", version.value().c_str());
    return 0;
  }
  if (argc != 1) {
    std::fprintf(stderr, "usage: %s [--version] (a compile request on stdin)\n", argv[0]);
    return 2;
  }
  std::string input;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(0, buffer, sizeof buffer);
    if (n < 0) {
      std::perror("flashjit-hiprtc-worker: reading stdin");
      return 2;
    }
    if (n == 0) break;
    input.append(buffer, static_cast<size_t>(n));
  }
  flashjit::Result<HiprtcRequest> request = decode_request(input);
  if (!request.ok()) {
    std::fprintf(stderr, "flashjit-hiprtc-worker: %s\n", request.error().message.c_str());
    return 2;
  }
  const HiprtcResponse response = compile_in_this_process(request.value());
  return write_all(1, encode_response(response)) ? 0 : 3;
}
