// Status and Result<T>: how Pagoda reports failures caused by input, files or resources.
//
// A Status is either ok or carries a code and a one-line, human-readable message that names
// what failed (for a file: its path and the problem). Result<T> holds a T or a non-ok Status.
// Broken invariants (bugs) use PAGODA_CHECK (base/check.h) instead. Both types are plain values
// and thread-compatible.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace pagoda {

enum class StatusCode {
  kOk,
  kInvalidArgument,    // a bad request, flag or argument
  kNotFound,           // a file, tensor, key or token that is not there
  kDataLoss,           // a truncated, corrupted or inconsistent file
  kUnimplemented,      // valid input we do not support (an unknown architecture, a tensor type)
  kResourceExhausted,  // out of memory, KV blocks, or a size limit
  kIoError,            // the operating system refused (open, mmap, read)
  kInternal,           // a third-party library failed unexpectedly
  kUnavailable,        // the service cannot take work now (shutting down, failed)
};

// Returns the code's name, e.g. "invalid argument".
const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "<context>: <message>".
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status resource_exhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }

// Holds either a value or a non-ok Status. Accessing the value of an error Result is a bug.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error; an ok Status when the Result holds a value.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace pagoda

#define PAGODA_CONCAT_INNER_(a, b) a##b
#define PAGODA_CONCAT_(a, b) PAGODA_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) is not ok.
#define PAGODA_RETURN_IF_ERROR(expr)             \
  do {                                           \
    ::pagoda::Status pagoda_status_ = (expr);    \
    if (!pagoda_status_.ok()) return pagoda_status_; \
  } while (0)

// `PAGODA_ASSIGN_OR_RETURN(auto x, f());` declares x from a Result, or returns its Status.
#define PAGODA_ASSIGN_OR_RETURN(lhs, expr) \
  PAGODA_ASSIGN_OR_RETURN_IMPL_(PAGODA_CONCAT_(pagoda_result_, __LINE__), lhs, expr)
#define PAGODA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
