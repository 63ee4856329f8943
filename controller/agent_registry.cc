#include "controller/agent_registry.h"

#include <algorithm>
#include <cstdio>

#include <spdlog/spdlog.h>

namespace gatehouse::controller {

AgentRegistry::AgentRegistry(LeaseConfig lease, MonotonicClock clock)
    : lease_(lease),
      clock_(std::move(clock)),
      not_yet_heard_(clock_() + std::max(lease_.restart_grace - lease_.lease_timeout(),
                                         std::chrono::milliseconds(0))) {}

std::chrono::steady_clock::time_point AgentRegistry::LastHeardLocked(const std::string& id) const {
  auto it = last_seen_.find(id);
  return it != last_seen_.end() ? it->second : not_yet_heard_;
}

bool AgentRegistry::SilentLocked(const std::string& id,
                                 std::chrono::steady_clock::time_point now) const {
  return now - LastHeardLocked(id) > lease_.lease_timeout();
}

Status AgentRegistry::CheckNameLocked(const AgentHello& hello,
                                      std::chrono::steady_clock::time_point now) const {
  auto it = agents_.find(hello.name);
  // An attached instance that said who it is keeps its name against anyone else, including
  // a Register that names no instance.
  if (it != agents_.end() && !it->second.instance_id.empty() &&
      it->second.instance_id != hello.instance_id && !SilentLocked(hello.name, now)) {
    const double heard_s = std::chrono::duration<double>(now - LastHeardLocked(hello.name)).count();
    char ago[32];
    std::snprintf(ago, sizeof ago, "%.1f", heard_s);
    return Status::AlreadyExists("agent '" + hello.name +
                                 "' is already connected (another instance, heard from " + ago +
                                 " s ago); a second agent with this name is refused until the "
                                 "first disconnects or goes silent");
  }
  return Status::Ok();
}

Status AgentRegistry::CheckName(const AgentHello& hello) const {
  std::lock_guard lock(mu_);
  return CheckNameLocked(hello, clock_());
}

Status AgentRegistry::Attach(const std::string& id, const AgentHello& hello,
                             std::shared_ptr<AgentChannel> channel) {
  std::lock_guard lock(mu_);
  const auto now = clock_();
  GH_RETURN_IF_ERROR(CheckNameLocked(hello, now));
  last_seen_[id] = now;
  agents_[id] = Attached{std::max(hello.slots, 1), std::max(hello.gpus, 0), hello.torch_version,
                         hello.cuda_version,       std::move(channel),     hello.drain_reason,
                         hello.lane,               hello.gpu_models,       hello.instance_id,
                         hello.transformers_version, hello.memory_bytes,
                         hello.gpu_memory_bytes};
  return Status::Ok();
}

bool AgentRegistry::Detach(const std::string& id, const AgentChannel* channel) {
  std::lock_guard lock(mu_);
  auto it = agents_.find(id);
  if (it == agents_.end() || it->second.channel.get() != channel) return false;  // replaced
  agents_.erase(it);
  return true;
}

bool AgentRegistry::Touch(const std::string& id) {
  std::lock_guard lock(mu_);
  const auto now = clock_();
  const bool resumed = agents_.count(id) > 0 && SilentLocked(id, now);
  last_seen_[id] = now;
  return resumed;
}

bool AgentRegistry::SetDrainReason(const std::string& id, const std::string& reason) {
  std::lock_guard lock(mu_);
  auto it = agents_.find(id);
  if (it == agents_.end() || it->second.drain_reason == reason) return false;
  it->second.drain_reason = reason;
  if (reason.empty()) {
    spdlog::info("agent '{}' no longer drains", id);
    return true;
  }
  spdlog::warn("agent '{}' drains: {}", id, reason);
  return false;
}

bool AgentRegistry::HeartbeatWriteDue(const std::string& id) {
  std::lock_guard lock(mu_);
  const auto now = clock_();
  auto [it, inserted] = heartbeat_written_.try_emplace(id, now);
  if (!inserted && now - it->second < kHeartbeatWriteInterval) return false;
  it->second = now;
  return true;
}

std::shared_ptr<AgentChannel> AgentRegistry::Channel(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = agents_.find(id);
  return it == agents_.end() ? nullptr : it->second.channel;
}

std::vector<AgentView> AgentRegistry::SchedulableViews() const {
  std::vector<AgentView> views;
  std::lock_guard lock(mu_);
  const auto now = clock_();
  views.reserve(agents_.size());
  // agents_ and last_seen_ are both ordered by agent id: walk them together.
  auto seen = last_seen_.begin();
  for (const auto& [id, a] : agents_) {
    while (seen != last_seen_.end() && seen->first < id) ++seen;
    const auto heard = seen != last_seen_.end() && seen->first == id ? seen->second : not_yet_heard_;
    if (now - heard > lease_.lease_timeout()) continue;  // silent: no new work until heard from
    views.push_back({id, a.slots, 0, a.gpus, 0, a.torch_version, a.cuda_version, a.drain_reason,
                     a.lane, a.gpu_models, a.transformers_version, a.memory_bytes, 0,
                     a.gpu_memory_bytes});
  }
  return views;
}

std::optional<std::chrono::steady_clock::duration> AgentRegistry::SilentFor(
    const std::string& id) const {
  std::lock_guard lock(mu_);
  const auto now = clock_();
  if (!SilentLocked(id, now)) return std::nullopt;
  return now - LastHeardLocked(id);
}

AgentLiveness AgentRegistry::Liveness(const std::string& id) const {
  AgentLiveness out;
  std::lock_guard lock(mu_);
  const auto now = clock_();
  if (auto it = agents_.find(id); it != agents_.end()) {
    out.attached = true;
    out.slots = it->second.slots;
    out.drain_reason = it->second.drain_reason;
  }
  out.silent = SilentLocked(id, now);
  if (auto seen = last_seen_.find(id); seen != last_seen_.end()) out.heard_ago = now - seen->second;
  return out;
}

}  // namespace gatehouse::controller
