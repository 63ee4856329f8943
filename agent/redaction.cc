#include "agent/redaction.h"

#include <algorithm>
#include <cstdlib>

#include <nlohmann/json.hpp>

namespace gatehouse::agent {

Result<Redactor> Redactor::Create(
    const std::vector<std::pair<std::string, std::string>>& secrets) {
  Redactor r;
  for (const auto& [name, value] : secrets) {
    if (value.size() < kMinSecretBytes) {
      return Status::InvalidArgument("secret env " + name + ": its value has " +
                                     std::to_string(value.size()) + " bytes, fewer than " +
                                     std::to_string(kMinSecretBytes) +
                                     "; too short to redact safely");
    }
    const std::string replacement = "[REDACTED:" + name + "]";
    r.patterns_.push_back({value, replacement});
    // Inside an event line the value is JSON-escaped (quotes, backslashes, control bytes).
    std::string escaped = nlohmann::json(value).dump(-1, ' ', false,
                                                     nlohmann::json::error_handler_t::replace);
    escaped = escaped.substr(1, escaped.size() - 2);
    if (escaped != value) r.patterns_.push_back({escaped, replacement});
  }
  std::stable_sort(r.patterns_.begin(), r.patterns_.end(), [](const Pattern& a, const Pattern& b) {
    return a.value.size() > b.value.size();
  });
  return r;
}

std::string Redactor::Redact(std::string_view text) const {
  if (patterns_.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const Pattern* hit = nullptr;
    for (const Pattern& p : patterns_) {
      if (text.compare(i, p.value.size(), p.value) == 0) {
        hit = &p;
        break;
      }
    }
    if (hit != nullptr) {
      out += hit->replacement;
      i += hit->value.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

size_t Redactor::PendingSuffix(std::string_view text) const {
  size_t longest = 0;
  for (const Pattern& p : patterns_) {
    const size_t max_len = std::min(text.size(), p.value.size() - 1);
    for (size_t len = max_len; len > longest; --len) {
      if (text.substr(text.size() - len) == std::string_view(p.value).substr(0, len)) {
        longest = len;
        break;
      }
    }
  }
  return longest;
}

Result<std::vector<std::pair<std::string, std::string>>> SecretsFromEnvironment(
    const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& name : names) {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) {
      return Status::InvalidArgument("--secret-env " + name + ": not set in the environment");
    }
    out.emplace_back(name, value);
  }
  return out;
}

void RedactingSink::Event(int64_t attempt_id, int64_t seq, std::string_view json) {
  inner_.Event(attempt_id, seq, redactor_.Redact(json));
}

void RedactingSink::Log(int64_t attempt_id, std::string_view stream, int64_t /*offset*/,
                        std::string_view data) {
  StreamState& s = streams_[{attempt_id, std::string(stream)}];
  // Redact what is held with the new bytes, then hold back a tail that may begin a secret.
  std::string redacted = redactor_.Redact(s.held + std::string(data));
  const size_t hold = redactor_.PendingSuffix(redacted);
  s.held = redacted.substr(redacted.size() - hold);
  redacted.resize(redacted.size() - hold);
  if (redacted.empty()) return;
  inner_.Log(attempt_id, stream, s.out_offset, redacted);
  s.out_offset += static_cast<int64_t>(redacted.size());
}

void RedactingSink::End(const AttemptEndReport& end) {
  for (auto it = streams_.begin(); it != streams_.end();) {
    if (it->first.first != end.attempt_id) {
      ++it;
      continue;
    }
    // What is still held is not a whole secret (the stream ended inside a mere prefix).
    if (!it->second.held.empty()) {
      inner_.Log(end.attempt_id, it->first.second, it->second.out_offset, it->second.held);
    }
    it = streams_.erase(it);
  }
  AttemptEndReport redacted = end;
  redacted.reason = redactor_.Redact(end.reason);
  inner_.End(redacted);
}

}  // namespace gatehouse::agent
