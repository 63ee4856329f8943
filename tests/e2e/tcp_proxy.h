// A TCP proxy on 127.0.0.1 that can cut its connections, for network-fault tests: the agent
// talks to the controller through it, and Cut() drops every live connection at once (both ends
// see the stream break, as with a failed switch) and refuses new ones for a while.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace gatehouse::testing {

class TcpProxy {
 public:
  /// Listens on 127.0.0.1 (an ephemeral port) and forwards each connection to
  /// 127.0.0.1:`target_port`.
  explicit TcpProxy(int target_port);
  ~TcpProxy();  // closes everything and joins its threads
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  /// Shuts down every live connection (both directions) and, for `blackout`, closes new
  /// connections as soon as they are accepted. Returns the number of connections cut.
  int Cut(std::chrono::milliseconds blackout);

 private:
  void AcceptLoop();
  void Pump(int from, int to);

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;  // guards below
  std::vector<std::pair<int, int>> connections_;  // (client fd, upstream fd)
  std::vector<std::thread> pumps_;
  std::chrono::steady_clock::time_point refuse_until_{};
  std::thread acceptor_;
};

}  // namespace gatehouse::testing
