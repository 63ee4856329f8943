#include "controller/agent_service.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <chrono>

#include <spdlog/spdlog.h>

#include "common/file_util.h"
#include "gatehouse/agent/v1/agent.grpc.pb.h"

namespace gatehouse::controller {
namespace {

namespace pb = gatehouse::agent::v1;
using Stream = grpc::ServerReaderWriter<pb::ControllerMessage, pb::AgentMessage>;

constexpr auto kShutdownGrace = std::chrono::seconds(2);

grpc::Status ToGrpc(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return grpc::Status::OK;
    case StatusCode::kInvalidArgument:
      return {grpc::StatusCode::INVALID_ARGUMENT, s.message()};
    case StatusCode::kNotFound:
      return {grpc::StatusCode::NOT_FOUND, s.message()};
    case StatusCode::kAlreadyExists:
      return {grpc::StatusCode::ALREADY_EXISTS, s.message()};
    case StatusCode::kFailedPrecondition:
      return {grpc::StatusCode::FAILED_PRECONDITION, s.message()};
    case StatusCode::kDataLoss:
      return {grpc::StatusCode::DATA_LOSS, s.message()};
    case StatusCode::kUnavailable:
      return {grpc::StatusCode::UNAVAILABLE, s.message()};
    case StatusCode::kInternal:
      return {grpc::StatusCode::INTERNAL, s.message()};
    case StatusCode::kUnauthenticated:
      return {grpc::StatusCode::UNAUTHENTICATED, s.message()};
    case StatusCode::kPermissionDenied:
      return {grpc::StatusCode::PERMISSION_DENIED, s.message()};
    case StatusCode::kDeadlineExceeded:
      return {grpc::StatusCode::DEADLINE_EXCEEDED, s.message()};
    case StatusCode::kResourceExhausted:
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, s.message()};
  }
  return {grpc::StatusCode::UNKNOWN, s.message()};
}

/// The outbound half of one agent stream. Writes are serialised; after Close() (the handler is
/// returning) sends fail instead of touching the dead stream.
class GrpcAgentChannel : public AgentChannel {
 public:
  explicit GrpcAgentChannel(Stream* stream) : stream_(stream) {}

  bool SendAssignment(const AssignmentMessage& a) override {
    pb::ControllerMessage msg;
    pb::Assignment* out = msg.mutable_assignment();
    out->set_attempt_id(a.attempt_id);
    out->set_cell_id(a.cell_id);
    out->set_spec_json(a.spec_json);
    out->set_branch(a.branch);
    return Write(msg);
  }

  bool SendCancel(int64_t attempt_id, const std::string& reason) override {
    pb::ControllerMessage msg;
    pb::Cancel* out = msg.mutable_cancel();
    out->set_attempt_id(attempt_id);
    out->set_reason(reason);
    return Write(msg);
  }

  bool Write(const pb::ControllerMessage& msg) {
    std::lock_guard lock(mu_);
    return !closed_ && stream_->Write(msg);
  }

  void Close() {
    std::lock_guard lock(mu_);
    closed_ = true;
  }

 private:
  std::mutex mu_;
  Stream* stream_;
  bool closed_ = false;
};

class AgentServiceImpl final : public pb::AgentService::Service {
 public:
  AgentServiceImpl(ControllerCore& core, Authenticator* auth) : core_(core), auth_(auth) {}

  grpc::Status Connect(grpc::ServerContext* context, Stream* stream) override {
    std::string token_name;  // with auth: the agent token's name, which bounds agent names
    std::string authorization;  // with auth: checked again on every heartbeat
    if (auth_ != nullptr) {
      const auto& metadata = context->client_metadata();
      if (auto it = metadata.find("authorization"); it != metadata.end()) {
        authorization.assign(it->second.data(), it->second.size());
      }
      auto principal = auth_->AuthorizeAgent(authorization);
      if (!principal.ok()) {
        spdlog::warn("agent stream from {} refused: {}", context->peer(),
                     principal.status().message());
        return ToGrpc(principal.status());
      }
      token_name = principal->name;
    }
    pb::AgentMessage first;
    if (!stream->Read(&first)) return grpc::Status::OK;  // closed before saying anything
    if (!first.has_register_()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "the first message must be Register"};
    }
    const pb::Register& reg = first.register_();
    // An agent token names the agents it may run as: its own name, or "<name>-<anything>"
    // (one token for a pool of nodes), so a token cannot register as another pool's agent.
    if (!token_name.empty() && reg.agent_name() != token_name &&
        reg.agent_name().rfind(token_name + "-", 0) != 0) {
      spdlog::warn("register from {} refused: agent '{}' with token '{}'", context->peer(),
                   reg.agent_name(), token_name);
      return {grpc::StatusCode::PERMISSION_DENIED,
              "agent token '" + token_name + "' may register agents named '" + token_name +
                  "' or '" + token_name + "-...', not '" + reg.agent_name() + "'"};
    }
    AgentHello hello;
    hello.name = reg.agent_name();
    hello.slots = reg.capabilities().slots() > 0 ? reg.capabilities().slots() : 1;
    hello.gpus = reg.capabilities().gpus_size();
    hello.torch_version = reg.capabilities().torch_version();
    hello.cuda_version = reg.capabilities().cuda_version();
    google::protobuf::util::JsonPrintOptions json_options;
    json_options.preserve_proto_field_names = true;
    if (!google::protobuf::util::MessageToJsonString(reg.capabilities(), &hello.capabilities_json,
                                                     json_options)
             .ok()) {
      hello.capabilities_json = "{}";
    }
    hello.held_attempts.assign(reg.running_attempt_ids().begin(), reg.running_attempt_ids().end());
    hello.drain_reason = reg.drain_reason();
    hello.instance_id = reg.instance_id();
    if (auto lane = reg.capabilities().labels().find("lane");
        lane != reg.capabilities().labels().end()) {
      hello.lane = lane->second;
    }
    for (const auto& gpu : reg.capabilities().gpus()) hello.gpu_models.push_back(gpu.model());
    auto agent_id = core_.RegisterAgent(hello);
    if (!agent_id.ok()) {
      spdlog::warn("register from {} refused: {}", context->peer(), agent_id.status().message());
      return ToGrpc(agent_id.status());
    }

    auto channel = std::make_shared<GrpcAgentChannel>(stream);
    pb::ControllerMessage registered;
    registered.mutable_registered()->set_agent_id(*agent_id);
    registered.mutable_registered()->set_heartbeat_interval_ms(
        static_cast<int32_t>(core_.lease_config().heartbeat_interval.count()));
    if (!channel->Write(registered)) {
      core_.DetachAgent(*agent_id, channel.get());
      return grpc::Status::OK;
    }
    if (Status attached = core_.AttachAgent(*agent_id, hello, channel); !attached.ok()) {
      spdlog::warn("attach from {} refused: {}", context->peer(), attached.message());
      channel->Close();
      return ToGrpc(attached);
    }
    spdlog::info("agent '{}' registered from {}", *agent_id, context->peer());

    pb::AgentMessage msg;
    while (stream->Read(&msg)) {
      if (auth_ != nullptr && msg.has_heartbeat()) {
        // A token revoked while its stream is open ends the stream at the next heartbeat:
        // the agent takes and reports nothing more (its leases expire and are retried).
        auto principal = auth_->AuthorizeAgent(authorization);
        if (!principal.ok()) {
          spdlog::warn("agent '{}': stream ended: {}", *agent_id, principal.status().message());
          channel->Close();
          core_.DetachAgent(*agent_id, channel.get());
          return ToGrpc(principal.status());
        }
      }
      const Status s = Dispatch(*agent_id, msg, *channel);
      if (s.code() == StatusCode::kInternal || s.code() == StatusCode::kDataLoss ||
          s.code() == StatusCode::kUnavailable) {
        // Not stored: end the stream, so the agent reconnects and resends (nothing it sent
        // after this message is acknowledged either).
        channel->Close();
        core_.DetachAgent(*agent_id, channel.get());
        return ToGrpc(Status::Unavailable("controller could not store a message: " + s.message()));
      }
    }

    channel->Close();
    core_.DetachAgent(*agent_id, channel.get());
    return grpc::Status::OK;
  }

 private:
  // Applies one message. A bad message is logged and skipped (the stream stays open); the
  // status is returned so a store failure can end the stream.
  Status Dispatch(const std::string& agent_id, const pb::AgentMessage& msg,
                  GrpcAgentChannel& channel) {
    Status s;
    switch (msg.msg_case()) {
      case pb::AgentMessage::kHeartbeat:
        s = core_.Heartbeat(agent_id, msg.heartbeat().drain_reason());
        break;
      case pb::AgentMessage::kEvent: {
        const auto& e = msg.event();
        s = core_.RecordEvent(agent_id, e.attempt_id(), e.seq(), e.json());
        break;
      }
      case pb::AgentMessage::kLog: {
        const auto& l = msg.log();
        s = core_.RecordLog(agent_id, l.attempt_id(), l.stream(), l.offset(), l.data());
        break;
      }
      case pb::AgentMessage::kEnd: {
        const auto& e = msg.end();
        s = core_.EndAttempt(agent_id, e.attempt_id(), e.outcome(), e.reason(), e.exit_code());
        // Stored, or nothing more to take for this attempt (unknown, or leased to another
        // agent): the agent may forget its messages. A store failure is not acknowledged, so
        // the agent resends after its next registration.
        if (s.ok() || s.code() == StatusCode::kNotFound ||
            s.code() == StatusCode::kFailedPrecondition) {
          pb::ControllerMessage ack;
          ack.mutable_end_ack()->set_attempt_id(e.attempt_id());
          channel.Write(ack);
        }
        break;
      }
      case pb::AgentMessage::kRegister:
        s = Status::FailedPrecondition("Register sent twice on one stream; ignored");
        break;
      case pb::AgentMessage::MSG_NOT_SET:
        s = Status::InvalidArgument("empty AgentMessage");
        break;
    }
    if (!s.ok()) spdlog::warn("agent '{}': {}", agent_id, s.ToString());
    return s;
  }

  ControllerCore& core_;
  Authenticator* auth_;
};

}  // namespace

struct AgentRpcServer::Impl {
  Impl(ControllerCore& core, Authenticator* auth) : service(core, auth) {}
  AgentServiceImpl service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  bool shut_down = false;
};

AgentRpcServer::AgentRpcServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AgentRpcServer::~AgentRpcServer() { Shutdown(); }

Result<std::unique_ptr<AgentRpcServer>> AgentRpcServer::Start(const std::string& address,
                                                              ControllerCore& core,
                                                              const Options& options) {
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
      return Status::InvalidArgument("grpc TLS needs both a certificate and a key file");
    }
    auto cert = ReadFileToString(options.tls_cert_file, "grpc TLS certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadFileToString(options.tls_key_file, "grpc TLS key");
    if (!key.ok()) return key.status();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!options.tls_client_ca_file.empty()) {
      auto ca = ReadFileToString(options.tls_client_ca_file, "grpc TLS client CA");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
      ssl.client_certificate_request =
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    credentials = grpc::SslServerCredentials(ssl);
  } else if (!options.tls_client_ca_file.empty()) {
    return Status::InvalidArgument("grpc mutual TLS (a client CA) needs a certificate and key");
  }
  auto impl = std::make_unique<Impl>(core, options.auth);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, credentials, &impl->port);
  builder.RegisterService(&impl->service);
  impl->server = builder.BuildAndStart();
  if (!impl->server || impl->port == 0) {
    return Status::Unavailable("grpc: cannot listen on '" + address + "'");
  }
  return std::unique_ptr<AgentRpcServer>(new AgentRpcServer(std::move(impl)));
}

int AgentRpcServer::port() const { return impl_->port; }

void AgentRpcServer::Shutdown() {
  if (!impl_ || impl_->shut_down) return;
  impl_->shut_down = true;
  impl_->server->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  impl_->server->Wait();
}

}  // namespace gatehouse::controller
