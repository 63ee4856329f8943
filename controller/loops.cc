#include "controller/loops.h"

namespace gatehouse::controller {
namespace {

// Asks `thread` to stop (under `mu`, so its wait sees the flag) and joins it outside the lock.
void StopThread(std::mutex& mu, std::condition_variable& cv, bool& stopping, std::thread& thread) {
  std::thread joining;
  {
    std::lock_guard lock(mu);
    if (!thread.joinable()) return;
    stopping = true;
    joining = std::move(thread);
  }
  cv.notify_all();
  joining.join();
}

}  // namespace

CoalescingLoop::CoalescingLoop(std::function<void()> pass, std::chrono::milliseconds min_interval)
    : pass_(std::move(pass)), min_interval_(min_interval) {}

CoalescingLoop::~CoalescingLoop() { Stop(); }

void CoalescingLoop::Start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return requested_ || stopping_; });
      if (stopping_) return;
      requested_ = false;
      lock.unlock();
      const auto started = std::chrono::steady_clock::now();
      pass_();
      lock.lock();
      // Requests made within min_interval_ of a pass's start wait for its end: one pass then
      // serves the whole batch.
      cv_.wait_until(lock, started + min_interval_, [this] { return stopping_; });
    }
  });
}

void CoalescingLoop::Stop() { StopThread(mu_, cv_, stopping_, thread_); }

void CoalescingLoop::Request() {
  {
    std::lock_guard lock(mu_);
    if (thread_.joinable()) {
      requested_ = true;
      cv_.notify_one();
      return;
    }
  }
  pass_();
}

PeriodicLoop::PeriodicLoop(std::function<void()> task, std::chrono::milliseconds interval)
    : task_(std::move(task)), interval_(interval) {}

PeriodicLoop::~PeriodicLoop() { Stop(); }

void PeriodicLoop::Start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, interval_, [this] { return stopping_; })) {
      lock.unlock();
      task_();
      lock.lock();
    }
  });
}

void PeriodicLoop::Stop() { StopThread(mu_, cv_, stopping_, thread_); }

}  // namespace gatehouse::controller
