// The agent RPC service (gRPC, proto/gatehouse/agent/v1/agent.proto): translates the agent
// stream to ControllerCore calls and Assignments back to the stream.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "controller/auth.h"
#include "controller/controller_core.h"

namespace gatehouse::controller {

/// Options of AgentRpcServer::Start.
struct AgentRpcOptions {
  /// Checks the stream's "authorization: Bearer <agent token>" metadata before Register is
  /// read (UNAUTHENTICATED / PERMISSION_DENIED end the call). nullptr: no check.
  Authenticator* auth = nullptr;
  /// PEM files. cert and key both set: TLS; both empty: plaintext (loopback, tests).
  std::string tls_cert_file;
  std::string tls_key_file;
  /// Set (needs TLS): mutual TLS; an agent must present a certificate signed by this CA.
  std::string tls_client_ca_file;
};

/// A running gRPC server with AgentService.Connect.
///
/// Each agent stream is a gRPC callback-API reactor, not a thread: Register first (else
/// INVALID_ARGUMENT), Registered back, then heartbeats, events, log chunks and attempt ends
/// until the agent closes. Messages are applied in order on gRPC's callback threads;
/// assignments are queued from whichever thread schedules and written one at a time.
class AgentRpcServer {
 public:
  using Options = AgentRpcOptions;

  /// Binds `address` ("127.0.0.1:50051"; port 0 picks one) and serves. Errors: UNAVAILABLE
  /// when it cannot bind; INVALID_ARGUMENT / NOT_FOUND for unusable TLS options or files.
  static Result<std::unique_ptr<AgentRpcServer>> Start(const std::string& address,
                                                       ControllerCore& core,
                                                       const Options& options = {});
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
