#include "errors.hpp"

#include <exception>

namespace flashjit::python {
namespace {

// The Python exception classes, created at import (register_exceptions).
PyObject* g_error = nullptr;             // flashjit.Error(RuntimeError)
PyObject* g_invalid_argument = nullptr;  // flashjit.InvalidArgumentError(Error, ValueError)
PyObject* g_unsupported = nullptr;       // flashjit.UnsupportedError(Error, ValueError)
PyObject* g_no_device = nullptr;         // flashjit.NoDeviceError(Error)

PyObject* exception_type(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return g_invalid_argument;
    case ErrorCode::Unsupported:
      return g_unsupported;
    case ErrorCode::NoDevice:
      return g_no_device;
    default:
      return g_error;
  }
}

void set_python_error(const LibraryError& error) {
  PyObject* type = exception_type(error.code);
  nb::object instance = nb::steal(PyObject_CallFunction(type, "s", error.what()));
  if (!instance.is_valid()) return;  // the call set its own error
  PyObject_SetAttrString(instance.ptr(), "code", nb::str(to_string(error.code)).ptr());
  PyErr_SetObject(type, instance.ptr());
}

}  // namespace

void register_exceptions(nb::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "flashjit.Error",
      "An error reported by the flashjit library; .code names its kind (InvalidArgument, "
      "Unsupported, NoDevice, CompileFailed, DriverError, LaunchFailed, IoError, NotFound).",
      PyExc_RuntimeError, nullptr);
  nb::object value_error_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError));
  g_invalid_argument = PyErr_NewExceptionWithDoc(
      "flashjit.InvalidArgumentError",
      "A bad argument (shape, dtype, layout, device mismatch, strides, config).",
      value_error_bases.ptr(), nullptr);
  g_unsupported = PyErr_NewExceptionWithDoc("flashjit.UnsupportedError",
                                            "A valid request this build or device cannot serve.",
                                            value_error_bases.ptr(), nullptr);
  g_no_device = PyErr_NewExceptionWithDoc(
      "flashjit.NoDeviceError", "No usable device (no GPU, no driver).", g_error, nullptr);
  m.attr("Error") = nb::handle(g_error);
  m.attr("InvalidArgumentError") = nb::handle(g_invalid_argument);
  m.attr("UnsupportedError") = nb::handle(g_unsupported);
  m.attr("NoDeviceError") = nb::handle(g_no_device);

  nb::register_exception_translator([](const std::exception_ptr& pointer, void*) {
    try {
      std::rethrow_exception(pointer);
    } catch (const LibraryError& error) {
      set_python_error(error);
    }
  });
}

}  // namespace flashjit::python
