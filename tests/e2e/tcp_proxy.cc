#include "tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <stdexcept>

namespace gatehouse::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

}  // namespace

TcpProxy::TcpProxy(int target_port) : target_port_(target_port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(0);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 16) != 0) {
    throw std::runtime_error("tcp proxy: cannot listen on 127.0.0.1");
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

TcpProxy::~TcpProxy() {
  stopping_ = true;
  acceptor_.join();
  ::close(listen_fd_);
  Cut(std::chrono::milliseconds(0));
  std::vector<std::thread> pumps;
  {
    std::lock_guard lock(mu_);
    pumps.swap(pumps_);
  }
  for (auto& t : pumps) t.join();
  std::lock_guard lock(mu_);
  for (auto [a, b] : connections_) {
    ::close(a);
    ::close(b);
  }
}

void TcpProxy::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const int client = ::accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    {
      std::lock_guard lock(mu_);
      if (std::chrono::steady_clock::now() < refuse_until_) {
        ::close(client);  // the network is down
        continue;
      }
    }
    const int upstream = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in target = Loopback(target_port_);
    if (upstream < 0 ||
        ::connect(upstream, reinterpret_cast<sockaddr*>(&target), sizeof(target)) != 0) {
      ::close(client);
      if (upstream >= 0) ::close(upstream);
      continue;
    }
    std::lock_guard lock(mu_);
    connections_.emplace_back(client, upstream);
    pumps_.emplace_back([this, client, upstream] { Pump(client, upstream); });
    pumps_.emplace_back([this, client, upstream] { Pump(upstream, client); });
  }
}

void TcpProxy::Pump(int from, int to) {
  std::array<char, 16384> buffer{};
  while (true) {
    const ssize_t n = ::recv(from, buffer.data(), buffer.size(), 0);
    if (n <= 0) break;
    ssize_t sent = 0;
    while (sent < n) {
      const ssize_t m = ::send(to, buffer.data() + sent, static_cast<size_t>(n - sent), MSG_NOSIGNAL);
      if (m <= 0) break;
      sent += m;
    }
    if (sent < n) break;
  }
  // One direction ended: end both, as a broken link would.
  ::shutdown(from, SHUT_RDWR);
  ::shutdown(to, SHUT_RDWR);
}

int TcpProxy::Cut(std::chrono::milliseconds blackout) {
  std::lock_guard lock(mu_);
  refuse_until_ = std::chrono::steady_clock::now() + blackout;
  int cut = 0;
  for (auto [a, b] : connections_) {
    if (::shutdown(a, SHUT_RDWR) == 0) ++cut;
    ::shutdown(b, SHUT_RDWR);
  }
  return cut;
}

}  // namespace gatehouse::testing
