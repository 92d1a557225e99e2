// `flashjit devices`: the CUDA and AMD devices present with their limits and the fingerprints
// their tuning results are stored under, the host CPU, and the table architectures (--arch).
#pragma once

#include <string>

namespace flashjit::cli {

// Prints the devices to stdout; returns 0.
int run_devices();

// Why there is no usable CUDA device 0, for messages ("libcuda.so.1: cannot open shared object").
std::string no_device_reason();

}  // namespace flashjit::cli
