// Status and Result<T>: how errors cross module boundaries in Gatehouse.
//
// Exceptions from third-party code (LibTorch, Beast, JSON parsing, libgit2 wrappers) are caught
// at the edge of the module that calls them and turned into a Status with a message that names
// the field, tensor or path and the offending value. Nothing throws across a module boundary.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace gatehouse {

/// Error categories. Transports map them once, at their edge (REST: 400/404/409/500...).
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // malformed input: names the field and value
  kNotFound,            // a named thing (cell, branch, file, tensor) does not exist
  kAlreadyExists,
  kFailedPrecondition,  // the input is well-formed but the state forbids it
  kDataLoss,            // a file is corrupt or lies about itself (truncated, bad offsets)
  kUnavailable,         // a dependency (network, process) is unreachable; may be retried
  kInternal,            // a bug or an unexpected failure
  kUnauthenticated,     // no credentials, or credentials that are not valid
  kPermissionDenied,    // valid credentials that do not allow the operation
  kDeadlineExceeded,    // a time limit passed before the operation completed
  kResourceExhausted,   // a size or count limit was exceeded
};

/// Short upper-case name of a code, e.g. "INVALID_ARGUMENT".
std::string_view StatusCodeName(StatusCode code);

/// The outcome of an operation that returns no value. Cheap to copy when ok.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status Unauthenticated(std::string m) {
    return {StatusCode::kUnauthenticated, std::move(m)};
  }
  static Status PermissionDenied(std::string m) {
    return {StatusCode::kPermissionDenied, std::move(m)};
  }
  static Status DeadlineExceeded(std::string m) {
    return {StatusCode::kDeadlineExceeded, std::move(m)};
  }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "INVALID_ARGUMENT: field 'x': ..." or "OK".
  std::string ToString() const;

  /// Returns a copy whose message is prefixed with `context + ": "`.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

/// A value of type T or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result constructed from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  /// The error; Status::Ok() when a value is held.
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

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

}  // namespace gatehouse

#define GH_CONCAT_INNER_(a, b) a##b
#define GH_CONCAT_(a, b) GH_CONCAT_INNER_(a, b)

/// Returns the Status from the enclosing function if `expr` is not ok.
#define GH_RETURN_IF_ERROR(expr)                   \
  do {                                             \
    ::gatehouse::Status gh_status_ = (expr);       \
    if (!gh_status_.ok()) return gh_status_;       \
  } while (0)

/// `GH_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a Result or returns its Status.
#define GH_ASSIGN_OR_RETURN(lhs, expr) GH_ASSIGN_OR_RETURN_IMPL_(GH_CONCAT_(gh_result_, __LINE__), lhs, expr)
#define GH_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
