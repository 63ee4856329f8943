// The agent RPC service (gRPC, proto/gatehouse/agent/v1/agent.proto): translates the agent
// stream to ControllerCore calls and Assignments back to the stream.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "controller/controller_core.h"

namespace gatehouse::controller {

/// A running gRPC server with AgentService.Connect.
///
/// Each agent stream runs on its own gRPC thread: Register first (else INVALID_ARGUMENT),
/// Registered back, then heartbeats, events, log chunks and attempt ends until the agent
/// closes; assignments are written to the stream from whichever thread schedules.
class AgentRpcServer {
 public:
  /// Binds `address` ("127.0.0.1:50051"; port 0 picks one) and serves.
  /// Errors: UNAVAILABLE when it cannot bind.
  static Result<std::unique_ptr<AgentRpcServer>> Start(const std::string& address,
                                                       ControllerCore& core);
  ~AgentRpcServer();  // Shutdown()s.

  /// The bound port.
  int port() const;

  /// Stops accepting, cancels open streams after a short grace period, waits for handlers.
  void Shutdown();

  struct Impl;

 private:
  explicit AgentRpcServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gatehouse::controller
