// The controller's two background threads, as small reusable loops: one that runs a pass on
// request, batching requests (the scheduler), and one that runs a task every interval (lease
// expiry and time limits). Neither knows what it runs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace gatehouse::controller {

/// Runs `pass` on its own thread when asked. A request made while a pass runs is served by one
/// more pass, started at least `min_interval` after the previous one started, so a burst of
/// requests costs a few passes, not one each (the price: at most that much latency). Before
/// Start (and after Stop), Request runs the pass on the caller's thread.
///
/// Threading: Request is thread-safe; Start and Stop are idempotent.
class CoalescingLoop {
 public:
  CoalescingLoop(std::function<void()> pass, std::chrono::milliseconds min_interval);
  ~CoalescingLoop();
  CoalescingLoop(const CoalescingLoop&) = delete;
  CoalescingLoop& operator=(const CoalescingLoop&) = delete;

  void Start();
  /// Stops and joins the thread after its current pass.
  void Stop();
  /// Asks for a pass: on the thread when started, else now on the caller's thread.
  void Request();

 private:
  const std::function<void()> pass_;
  const std::chrono::milliseconds min_interval_;
  std::mutex mu_;  // guards the three below
  std::condition_variable cv_;
  bool requested_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

/// Runs `task` on its own thread every `interval` (the first run one interval after Start)
/// until Stop. Threading: Start and Stop are idempotent.
class PeriodicLoop {
 public:
  PeriodicLoop(std::function<void()> task, std::chrono::milliseconds interval);
  ~PeriodicLoop();
  PeriodicLoop(const PeriodicLoop&) = delete;
  PeriodicLoop& operator=(const PeriodicLoop&) = delete;

  void Start();
  /// Stops and joins the thread after its current run.
  void Stop();

 private:
  const std::function<void()> task_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace gatehouse::controller
