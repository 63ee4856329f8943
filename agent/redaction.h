// Secret redaction: the values of the agent's secret environment variables (gatehouse-agent
// --secret-env NAME) never leave the node. Every log chunk, event line and end reason of an
// attempt passes through a RedactingSink before the transport sees it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/attempt_sink.h"
#include "common/status.h"

namespace gatehouse::agent {

/// Finds secret values in text and replaces each occurrence with "[REDACTED:<NAME>]".
/// Each value is also matched in its JSON-escaped form (as it appears inside event lines).
/// Immutable after construction; thread-safe.
class Redactor {
 public:
  /// Values shorter than kMinSecretBytes are refused (INVALID_ARGUMENT naming the variable):
  /// redacting "1" or "on" would shred every log.
  static constexpr size_t kMinSecretBytes = 6;
  static Result<Redactor> Create(const std::vector<std::pair<std::string, std::string>>& secrets);
  Redactor() = default;

  bool empty() const { return patterns_.empty(); }

  /// `text` with every occurrence of a secret replaced (longest secret first at each position).
  std::string Redact(std::string_view text) const;

  /// Length of the longest suffix of `text` that is a proper prefix of some secret: the bytes a
  /// streaming redactor must hold back until the next chunk shows whether a secret continues.
  size_t PendingSuffix(std::string_view text) const;

 private:
  struct Pattern {
    std::string value;
    std::string replacement;
  };
  std::vector<Pattern> patterns_;  // longest value first
};

/// Reads the named variables from this process's environment. A name that is unset is
/// INVALID_ARGUMENT (a misspelt --secret-env must not silently leak the real one).
Result<std::vector<std::pair<std::string, std::string>>> SecretsFromEnvironment(
    const std::vector<std::string>& names);

/// An AttemptSink that redacts before forwarding to `inner`, for one attempt at a time.
/// Log streams are redacted across chunk boundaries: the tail of a chunk that could start a
/// secret is held back until the next chunk of that stream (or End) decides it, and offsets
/// are those of the redacted stream, so they stay contiguous. End flushes what is held back
/// before forwarding the end.
class RedactingSink : public AttemptSink {
 public:
  RedactingSink(AttemptSink& inner, const Redactor& redactor)
      : inner_(inner), redactor_(redactor) {}

  void Event(int64_t attempt_id, int64_t seq, std::string_view json) override;
  void Log(int64_t attempt_id, std::string_view stream, int64_t offset,
           std::string_view data) override;
  void End(const AttemptEndReport& end) override;

 private:
  struct StreamState {
    std::string held;         // redacted bytes not yet forwarded
    int64_t out_offset = 0;   // offset of the next forwarded byte in the redacted stream
  };
  AttemptSink& inner_;
  const Redactor& redactor_;
  std::map<std::pair<int64_t, std::string>, StreamState> streams_;
};

}  // namespace gatehouse::agent
