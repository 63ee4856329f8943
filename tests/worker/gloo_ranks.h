// Test helpers for c10d gloo groups inside one test process: a free port on 127.0.0.1 and a
// runner that starts one thread per rank, joins the group (JoinGlooGroup) and hands each rank
// its communicator and the factory of its sub-groups. Used by tests/worker (distributed, tensor_parallel) and tests/models
// (the parallel gate).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gatehouse/worker/distributed.h"

namespace gatehouse::test_util {

/// A port on 127.0.0.1 that was free a moment ago.
inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

/// Runs `world` ranks, one thread each: every rank joins a gloo group on 127.0.0.1 (timeout
/// `timeout`) and calls `body(rank, comm, subgroups)`: the world's communicator and the
/// factory of its sub-groups. Returns per rank "" or the join error; exceptions
/// thrown by `body` are returned as "exception: <what>". The groups are destroyed only after
/// every rank's body returned, ranks > 0 first and rank 0 (which hosts the store) last, so no
/// rank tears its group down while a peer still talks to it.
inline std::vector<std::string> RunGlooGroups(
    int world,
    const std::function<void(int rank, std::shared_ptr<worker::TpCommunicator> comm,
                             std::shared_ptr<worker::SubgroupFactory> subgroups)>& body,
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  // c10d's process-wide FlightRecorder (on by default, 2000 entries) inserts into a map before
  // taking its mutex (FlightRecorderDetail.hpp recordWithResetEnabled, torch 2.11): several
  // process groups in one process, as here (one per rank thread), race on it and crashed
  // ParallelGateTest about once in 10 runs (std::_Rb_tree_insert_and_rebalance). A real worker
  // has one group per process. Turning the recorder off before the first group exists avoids
  // the race; it records nothing these tests read.
  ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/1);
  const int port = FreePort();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<c10::intrusive_ptr<c10d::Backend>> groups(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      worker::RankEnv env;
      env.rank = r;
      env.world_size = world;
      env.master_addr = "127.0.0.1";
      env.master_port = port;
      auto group = worker::JoinGlooGroup(env, timeout);
      if (!group.ok()) {
        errors[static_cast<size_t>(r)] = group.status().ToString();
        return;
      }
      groups[static_cast<size_t>(r)] = group->group;
      try {
        body(r, worker::MakeC10dCommunicator(group->group), group->subgroups);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::string("exception: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = world - 1; r >= 0; --r) groups[static_cast<size_t>(r)].reset();
  return errors;
}

/// RunGlooGroups for bodies that use the world group only: `body(rank, comm)`.
inline std::vector<std::string> RunGlooRanks(
    int world,
    const std::function<void(int rank, std::shared_ptr<worker::TpCommunicator> comm)>& body,
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  return RunGlooGroups(
      world,
      [&](int r, std::shared_ptr<worker::TpCommunicator> comm,
          std::shared_ptr<worker::SubgroupFactory>) { body(r, std::move(comm)); },
      timeout);
}

}  // namespace gatehouse::test_util
