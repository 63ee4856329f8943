#include "agent/outbox.h"

#include <algorithm>

namespace gatehouse::agent {

bool Outbox::Send(int64_t attempt_id, std::string bytes, bool droppable, const Write& write) {
  std::lock_guard lock(mu_);
  const bool keep = !droppable || bytes_ + bytes.size() <= max_bytes_;
  if (keep) {
    bytes_ += bytes.size();
    kept_.emplace_back(attempt_id, std::move(bytes));
    write(kept_.back().second);
  } else {
    write(bytes);
  }
  return keep;
}

size_t Outbox::Replay(const std::function<void()>& attach, const Write& write) {
  std::lock_guard lock(mu_);
  attach();
  size_t sent = 0;
  for (const auto& [attempt_id, bytes] : kept_) {
    if (!write(bytes)) break;  // the stream broke again: the next registration replays
    ++sent;
  }
  return sent;
}

void Outbox::Acknowledge(int64_t attempt_id) {
  std::lock_guard lock(mu_);
  std::erase_if(kept_, [&](const auto& entry) {
    if (entry.first != attempt_id) return false;
    bytes_ -= entry.second.size();
    return true;
  });
}

std::vector<int64_t> Outbox::Attempts() const {
  std::vector<int64_t> ids;
  {
    std::lock_guard lock(mu_);
    for (const auto& entry : kept_) ids.push_back(entry.first);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

size_t Outbox::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

}  // namespace gatehouse::agent
