#pragma once
/// \file Error types every loom component throws.
///
/// Three families, so that callers can tell *who* has to act:
///   * loom::input_error   — the user's input is wrong (a flag, a file, a shape, a token id).
///                           what() names the problem and the fix, in one line.
///   * loom::device_error  — a device or communication C API returned a failure code
///                           (ACL, HCCL, MPI). Carries the raw code and the call site.
///   * loom::numeric_error — a value went non-finite where that cannot be recovered
///                           (e.g. NaN in the loss during evaluation).
/// Destructors and deallocation never throw.
#include <stdexcept>
#include <string>
#include <string_view>
#if __has_include(<source_location>)
#include <source_location>
#endif

namespace loom {

#if defined(__cpp_lib_source_location)
/// The call site recorded by device_error: std::source_location.
using source_location = std::source_location;
#else
/// The call site recorded by device_error, for standard libraries whose std::source_location the
/// compiler cannot back (libstdc++ 12 with clang 14 lacks __builtin_source_location): the same
/// members, filled by the __builtin_FILE/LINE/FUNCTION intrinsics GCC and clang have long had.
struct source_location {
  static constexpr source_location current(const char* file = __builtin_FILE(), int line = __builtin_LINE(),
                                           const char* function = __builtin_FUNCTION()) noexcept {
    source_location s;
    s.file_ = file;
    s.line_ = line;
    s.function_ = function;
    return s;
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr unsigned line() const noexcept { return unsigned(line_); }
  constexpr unsigned column() const noexcept { return 0; }
  constexpr const char* function_name() const noexcept { return function_; }

 private:
  const char* file_ = "";
  int line_ = 0;
  const char* function_ = "";
};
#endif

/// Base of every exception loom throws; catch this to catch them all.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad user input. what(): "<problem>; <fix>" on one line, no stack trace needed.
class input_error : public error {
 public:
  using error::error;
};

/// A non-finite value where the caller asked for a finite one.
class numeric_error : public error {
 public:
  using error::error;
};

/// A failed call into a device or communication C API.
/// what(): "file:line: <api> failed with code <code>: <message>".
class device_error : public error {
 public:
  device_error(int code, std::string_view api, std::string_view message,
               loom::source_location where = loom::source_location::current())
      : error(std::string(where.file_name()) + ":" + std::to_string(where.line()) + ": " +
              std::string(api) + " failed with code " + std::to_string(code) +
              (message.empty() ? std::string() : ": " + std::string(message))),
        code_(code) {}
  /// The raw return code (aclError, HcclResult, MPI error class ...).
  int code() const noexcept { return code_; }

 private:
  int code_;
};

}  // namespace loom
