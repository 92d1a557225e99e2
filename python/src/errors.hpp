// Library errors on their way to Python: a C++ exception carrying the library's Error (raised by
// the module's functions), translated at the boundary into the flashjit exception of its code
// (flashjit.Error and subclasses, created by register_exceptions) with the library's message and
// a .code attribute.
#pragma once

#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "generator/error.hpp"

namespace flashjit::python {

namespace nb = nanobind;

struct LibraryError : std::runtime_error {
  explicit LibraryError(const Error& error) : std::runtime_error(error.message), code(error.code) {}
  ErrorCode code;
};

[[noreturn]] inline void raise(const Error& error) { throw LibraryError(error); }
[[noreturn]] inline void raise(ErrorCode code, std::string message) {
  raise(make_error(code, std::move(message)));
}
inline void check(const Status& status) {
  if (!status.ok()) raise(status.error());
}
template <class T>
T unwrap(Result<T> result) {
  if (!result.ok()) raise(result.error());
  return std::move(result.value());
}

// Creates flashjit.Error(RuntimeError), InvalidArgumentError(Error, ValueError),
// UnsupportedError(Error, ValueError) and NoDeviceError(Error) as attributes of `m`, and the
// translator from LibraryError to them.
void register_exceptions(nb::module_& m);

}  // namespace flashjit::python
