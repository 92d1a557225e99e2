// Errors as values: every fallible flashjit call returns Result<T> or Status.
// An Error names what was wrong (the value) and what is allowed.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace flashjit {

enum class ErrorCode {
  InvalidArgument,  // a caller-supplied value is out of range
  Unsupported,      // valid in principle, not supported by this build / device
  NoDevice,         // no driver or no device of the requested kind
  CompileFailed,    // run-time compilation failed; message carries the log
  DriverError,      // a driver call returned an error
  LaunchFailed,     // kernel launch or execution failed
  IoError,          // file system (cache, database)
  NotFound,         // a lookup found nothing
};

const char* to_string(ErrorCode code);

struct Error {
  ErrorCode code;
  std::string message;

  // "InvalidArgument: head_dim = 100: must be a multiple of 8 in [8, 256]"
  std::string describe() const { return std::string(to_string(code)) + ": " + message; }
};

// Result<T>: either a T or an Error. Minimal stand-in for std::expected (C++23).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}
  Result(Error error) : state_(std::move(error)) {}

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(state_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(state_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(state_));
  }
  const Error& error() const {
    assert(!ok());
    return std::get<1>(state_);
  }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Error> state_;
};

// Status: success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const {
    assert(!ok_);
    return error_;
  }

 private:
  Error error_{ErrorCode::InvalidArgument, {}};
  bool ok_ = true;
};

inline Status ok_status() { return Status(); }

inline Error make_error(ErrorCode code, std::string message) {
  return Error{code, std::move(message)};
}

}  // namespace flashjit

// Propagate an error from an expression returning Status or Result<T>.
#define FLASHJIT_TRY(expr)                                               \
  do {                                                                   \
    auto&& flashjit_try_result_ = (expr);                                \
    if (!flashjit_try_result_.ok()) return flashjit_try_result_.error(); \
  } while (0)
