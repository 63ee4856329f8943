#include "controller/agent_service.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <deque>
#include <mutex>

#include <spdlog/spdlog.h>

#include "common/file_util.h"
#include "gatehouse/agent/v1/agent.grpc.pb.h"

namespace gatehouse::controller {
namespace {

namespace pb = gatehouse::agent::v1;

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

class AgentStream;

/// The outbound half of one agent stream, held by ControllerCore while the agent is attached.
/// Messages are queued and written one at a time (the callback API allows one write in
/// flight); after the stream ends, sends return false instead of touching it.
class StreamChannel : public AgentChannel {
 public:
  explicit StreamChannel(AgentStream* stream) : stream_(stream) {}

  bool SendAssignment(const AssignmentMessage& a) override {
    pb::ControllerMessage msg;
    pb::Assignment* out = msg.mutable_assignment();
    out->set_attempt_id(a.attempt_id);
    out->set_cell_id(a.cell_id);
    out->set_spec_json(a.spec_json);
    out->set_branch(a.branch);
    out->set_memory_estimate_bytes(a.memory_estimate_bytes);
    out->set_memory_estimate(a.memory_estimate);
    for (const InputArtifact& in : a.inputs) {
      pb::InputArtifact* i = out->add_inputs();
      i->set_role(in.role);
      i->set_name(in.name);
      i->set_digest(in.digest);
      i->set_size(in.size);
    }
    return Send(std::move(msg));
  }

  bool SendCancel(int64_t attempt_id, const std::string& reason) override {
    pb::ControllerMessage msg;
    pb::Cancel* out = msg.mutable_cancel();
    out->set_attempt_id(attempt_id);
    out->set_reason(reason);
    return Send(std::move(msg));
  }

  /// Queues `msg`; starts writing it when no write is in flight. False once the stream is
  /// finishing or a write failed: `msg` is dropped (true means queued, not yet delivered).
  bool Send(pb::ControllerMessage msg);

  /// Ends the stream with `status`: with OK once the queued messages are written; with an
  /// error after the write in flight only (the queue is dropped); at once when a write
  /// failed. Idempotent: the first status wins.
  void Finish(grpc::Status status);

  /// The write in flight completed. Starts the next, or the deferred Finish.
  void OnWriteDone(bool ok);

 private:
  /// With mu_ held and no write in flight: what to start next (a write or the Finish). The
  /// caller starts it after unlocking, as gRPC may run a reaction inline.
  enum class Next { kNothing, kWrite, kFinish };
  Next NextLocked();
  void Start(Next next);

  std::mutex mu_;
  AgentStream* stream_;  // outlives every operation started here (OnDone waits for them)
  std::deque<pb::ControllerMessage> queue_;
  pb::ControllerMessage in_flight_;  // written now; untouched until OnWriteDone
  bool writing_ = false;
  bool broken_ = false;     // a write failed: the peer is gone
  bool finishing_ = false;  // Finish requested; nothing more is queued
  bool finished_ = false;   // Finish started
  grpc::Status status_;
};

/// One agent's Connect call (the gRPC callback API: no thread per stream). Register first
/// (else INVALID_ARGUMENT), Registered back, then heartbeats, events, log chunks and attempt
/// ends until the agent closes. One read is in flight at a time; each message is applied on
/// the gRPC thread that completed its read, before the next read starts, so an agent's
/// messages are applied in order.
class AgentStream final : public grpc::ServerBidiReactor<pb::AgentMessage, pb::ControllerMessage> {
 public:
  AgentStream(grpc::CallbackServerContext* context, ControllerCore& core, Authenticator* auth)
      : context_(context), core_(core), auth_(auth), channel_(std::make_shared<StreamChannel>(this)) {
    if (auth_ != nullptr) {
      const auto& metadata = context->client_metadata();
      if (auto it = metadata.find("authorization"); it != metadata.end()) {
        authorization_.assign(it->second.data(), it->second.size());
      }
      auto principal = auth_->AuthorizeAgent(authorization_);
      if (!principal.ok()) {
        spdlog::warn("agent stream from {} refused: {}", context->peer(),
                     principal.status().message());
        channel_->Finish(ToGrpc(principal.status()));
        return;
      }
      token_name_ = principal->name;
    }
    StartRead(&read_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return End(grpc::Status::OK);  // the agent closed, or the call was cancelled
    if (agent_id_.empty()) {
      if (grpc::Status s = OnRegister(); !s.ok()) return End(s);
    } else {
      if (auth_ != nullptr && read_.has_heartbeat()) {
        // A token revoked while its stream is open ends the stream at the next heartbeat:
        // the agent takes and reports nothing more (its leases expire and are retried).
        auto principal = auth_->AuthorizeAgent(authorization_);
        if (!principal.ok()) {
          spdlog::warn("agent '{}': stream ended: {}", agent_id_, principal.status().message());
          return End(ToGrpc(principal.status()));
        }
      }
      const Status s = Dispatch(read_);
      if (s.code() == StatusCode::kInternal || s.code() == StatusCode::kDataLoss ||
          s.code() == StatusCode::kUnavailable) {
        // Not stored: end the stream, so the agent reconnects and resends (nothing it sent
        // after this message is acknowledged either).
        return End(ToGrpc(Status::Unavailable("controller could not store a message: " +
                                              s.message())));
      }
    }
    StartRead(&read_);
  }

  void OnWriteDone(bool ok) override { channel_->OnWriteDone(ok); }

  void OnDone() override { delete this; }

 private:
  // Detaches the agent (when attached) and finishes the call with `status`.
  void End(grpc::Status status) {
    if (attached_) core_.DetachAgent(agent_id_, channel_.get());
    attached_ = false;
    channel_->Finish(std::move(status));
  }

  // Applies the first message, which must be Register. OK: registered and attached.
  grpc::Status OnRegister() {
    if (!read_.has_register_()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "the first message must be Register"};
    }
    const pb::Register& reg = read_.register_();
    // An agent token names the agents it may run as: its own name, or "<name>-<anything>"
    // (one token for a pool of nodes), so a token cannot register as another pool's agent.
    if (!token_name_.empty() && reg.agent_name() != token_name_ &&
        reg.agent_name().rfind(token_name_ + "-", 0) != 0) {
      spdlog::warn("register from {} refused: agent '{}' with token '{}'", context_->peer(),
                   reg.agent_name(), token_name_);
      return {grpc::StatusCode::PERMISSION_DENIED,
              "agent token '" + token_name_ + "' may register agents named '" + token_name_ +
                  "' or '" + token_name_ + "-...', not '" + reg.agent_name() + "'"};
    }
    AgentHello hello;
    hello.name = reg.agent_name();
    hello.slots = reg.capabilities().slots() > 0 ? reg.capabilities().slots() : 1;
    hello.gpus = reg.capabilities().gpus_size();
    hello.torch_version = reg.capabilities().torch_version();
    hello.cuda_version = reg.capabilities().cuda_version();
    hello.transformers_version = reg.capabilities().transformers_version();
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
    hello.memory_bytes = reg.capabilities().memory_bytes();
    for (const auto& gpu : reg.capabilities().gpus()) {
      hello.gpu_models.push_back(gpu.model());
      if (gpu.memory_bytes() > 0 &&
          (hello.gpu_memory_bytes == 0 || gpu.memory_bytes() < hello.gpu_memory_bytes)) {
        hello.gpu_memory_bytes = gpu.memory_bytes();
      }
    }
    auto agent_id = core_.RegisterAgent(hello);
    if (!agent_id.ok()) {
      spdlog::warn("register from {} refused: {}", context_->peer(), agent_id.status().message());
      return ToGrpc(agent_id.status());
    }
    agent_id_ = *agent_id;

    pb::ControllerMessage registered;
    registered.mutable_registered()->set_agent_id(agent_id_);
    registered.mutable_registered()->set_heartbeat_interval_ms(
        static_cast<int32_t>(core_.lease_config().heartbeat_interval.count()));
    // Queued before the agent is attached, so it precedes any assignment on the stream.
    if (!channel_->Send(std::move(registered))) {
      return {grpc::StatusCode::CANCELLED, "the stream closed before Registered was sent"};
    }
    if (Status attached = core_.AttachAgent(agent_id_, hello, channel_); !attached.ok()) {
      spdlog::warn("attach from {} refused: {}", context_->peer(), attached.message());
      return ToGrpc(attached);
    }
    attached_ = true;
    spdlog::info("agent '{}' registered from {}", agent_id_, context_->peer());
    return grpc::Status::OK;
  }

  // Applies one message. A bad message is logged and skipped (the stream stays open); the
  // status is returned so a store failure can end the stream.
  Status Dispatch(const pb::AgentMessage& msg) {
    Status s;
    switch (msg.msg_case()) {
      case pb::AgentMessage::kHeartbeat:
        s = core_.Heartbeat(agent_id_, msg.heartbeat().drain_reason());
        break;
      case pb::AgentMessage::kEvent: {
        const auto& e = msg.event();
        s = core_.RecordEvent(agent_id_, e.attempt_id(), e.seq(), e.json());
        break;
      }
      case pb::AgentMessage::kLog: {
        const auto& l = msg.log();
        s = core_.RecordLog(agent_id_, l.attempt_id(), l.stream(), l.offset(), l.data());
        break;
      }
      case pb::AgentMessage::kEnd: {
        const auto& e = msg.end();
        s = core_.EndAttempt(agent_id_, e.attempt_id(), e.outcome(), e.reason(), e.exit_code(),
                             e.oom_limit_bytes());
        // Stored, or nothing more to take for this attempt (unknown, or leased to another
        // agent): the agent may forget its messages. A store failure is not acknowledged, so
        // the agent resends after its next registration.
        if (s.ok() || s.code() == StatusCode::kNotFound ||
            s.code() == StatusCode::kFailedPrecondition) {
          pb::ControllerMessage ack;
          ack.mutable_end_ack()->set_attempt_id(e.attempt_id());
          channel_->Send(std::move(ack));
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
    if (!s.ok()) spdlog::warn("agent '{}': {}", agent_id_, s.ToString());
    return s;
  }

  grpc::CallbackServerContext* context_;
  ControllerCore& core_;
  Authenticator* auth_;
  std::shared_ptr<StreamChannel> channel_;  // also held by the core while attached
  std::string authorization_;  // with auth: checked again on every heartbeat
  std::string token_name_;     // with auth: the agent token's name, which bounds agent names
  std::string agent_id_;       // set by Register
  bool attached_ = false;      // read reactions only (they never overlap; OnWriteDone may)
  pb::AgentMessage read_;      // the read in flight
};

bool StreamChannel::Send(pb::ControllerMessage msg) {
  Next next;
  {
    std::lock_guard lock(mu_);
    if (finishing_ || broken_) return false;
    queue_.push_back(std::move(msg));
    if (writing_) return true;
    next = NextLocked();
  }
  Start(next);
  return true;
}

void StreamChannel::Finish(grpc::Status status) {
  Next next;
  {
    std::lock_guard lock(mu_);
    if (finishing_) return;
    finishing_ = true;
    // Ending on an error: what is still queued is dropped (the agent reconnects and the
    // controller reconciles), so a peer that stops reading cannot hold the call open.
    if (!status.ok()) queue_.clear();
    status_ = std::move(status);
    if (writing_) return;  // OnWriteDone finishes
    next = NextLocked();
  }
  Start(next);
}

void StreamChannel::OnWriteDone(bool ok) {
  Next next;
  {
    std::lock_guard lock(mu_);
    writing_ = false;
    if (!ok) {
      broken_ = true;
      queue_.clear();
    }
    next = NextLocked();
  }
  Start(next);
}

StreamChannel::Next StreamChannel::NextLocked() {
  if (!queue_.empty() && !broken_) {
    in_flight_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    return Next::kWrite;
  }
  if (finishing_ && !finished_) {
    finished_ = true;
    return Next::kFinish;
  }
  return Next::kNothing;
}

void StreamChannel::Start(Next next) {
  // Safe without mu_: while a write is in flight or Finish is not yet started, gRPC does not
  // call OnDone, so stream_ is alive; in_flight_ is not touched until OnWriteDone.
  if (next == Next::kWrite) stream_->StartWrite(&in_flight_);
  if (next == Next::kFinish) stream_->Finish(status_);
}

// The agent token's name from the call's metadata; empty without an Authenticator. Errors as
// Authenticator::AuthorizeAgent.
Result<std::string> AuthorizeCall(grpc::CallbackServerContext* context, Authenticator* auth) {
  if (auth == nullptr) return std::string();
  std::string authorization;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization.assign(it->second.data(), it->second.size());
  }
  GH_ASSIGN_OR_RETURN(auto principal, auth->AuthorizeAgent(authorization));
  return principal.name;
}

// An agent token names the agents it may act as: its own name or "<name>-<anything>".
bool TokenMayActAs(const std::string& token_name, const std::string& agent_name) {
  return token_name.empty() || agent_name == token_name ||
         agent_name.rfind(token_name + "-", 0) == 0;
}

/// One PutArtifact call: the header opens a blob writer, the chunks fill it, the end of the
/// stream commits it (size and digest checked) and records the artifact.
class ArtifactUpload final : public grpc::ServerReadReactor<pb::ArtifactChunk> {
 public:
  ArtifactUpload(grpc::CallbackServerContext* context, ControllerCore& core, Authenticator* auth,
                 pb::ArtifactStored* response)
      : core_(core), response_(response) {
    auto token = AuthorizeCall(context, auth);
    if (!token.ok()) {
      Finish(ToGrpc(token.status()));
      return;
    }
    token_name_ = *token;
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Complete();
    if (writer_ == nullptr) {
      if (!chunk_.has_header()) {
        return Finish({grpc::StatusCode::INVALID_ARGUMENT, "the first chunk must carry the header"});
      }
      header_ = chunk_.header();
      if (!TokenMayActAs(token_name_, header_.agent_name())) {
        return Finish({grpc::StatusCode::PERMISSION_DENIED,
                       "agent token '" + token_name_ + "' may not act as agent '" +
                           header_.agent_name() + "'"});
      }
      auto writer = core_.BeginArtifact(header_.agent_name(), header_.attempt_id(),
                                        header_.name(), header_.digest(), header_.size());
      if (!writer.ok()) return Finish(ToGrpc(writer.status()));
      writer_ = std::move(writer).value();
    }
    if (Status s = writer_->Append(chunk_.data()); !s.ok()) return Finish(ToGrpc(s));
    StartRead(&chunk_);
  }

  void OnDone() override { delete this; }

 private:
  void Complete() {
    if (writer_ == nullptr) {
      return Finish({grpc::StatusCode::INVALID_ARGUMENT, "no artifact header was sent"});
    }
    if (Status s = writer_->Commit(); !s.ok()) {
      spdlog::warn("attempt {}: artifact '{}' refused: {}", header_.attempt_id(), header_.name(),
                   s.message());
      return Finish(ToGrpc(s));
    }
    auto created = core_.RecordArtifact(header_.agent_name(), header_.attempt_id(), header_.name(),
                                        header_.digest(), header_.size());
    if (!created.ok()) return Finish(ToGrpc(created.status()));
    response_->set_created(*created);
    Finish(grpc::Status::OK);
  }

  ControllerCore& core_;
  pb::ArtifactStored* response_;
  std::string token_name_;
  pb::ArtifactChunk chunk_;
  pb::ArtifactHeader header_;
  std::unique_ptr<BlobStore::Writer> writer_;
};

/// One GetArtifact call: the blob's file in chunks of kArtifactChunkBytes, one write in flight.
class ArtifactDownload final : public grpc::ServerWriteReactor<pb::ArtifactChunk> {
 public:
  static constexpr size_t kArtifactChunkBytes = size_t{1} << 20;

  ArtifactDownload(grpc::CallbackServerContext* context, ControllerCore& core, Authenticator* auth,
                   const pb::ArtifactRequest* request) {
    auto token = AuthorizeCall(context, auth);
    if (!token.ok()) {
      Finish(ToGrpc(token.status()));
      return;
    }
    auto path = core.ArtifactPath(request->digest());
    if (!path.ok()) {
      Finish(ToGrpc(path.status()));
      return;
    }
    file_ = std::fopen(path->c_str(), "rb");
    std::error_code ec;
    const auto size = std::filesystem::file_size(*path, ec);
    if (file_ == nullptr || ec) {
      Finish({grpc::StatusCode::DATA_LOSS, "artifact " + request->digest() + " is unreadable"});
      return;
    }
    chunk_.mutable_header()->set_digest(request->digest());
    chunk_.mutable_header()->set_size(static_cast<int64_t>(size));
    Next();
  }

  ~ArtifactDownload() override {
    if (file_ != nullptr) std::fclose(file_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::CANCELLED);
    chunk_.clear_header();
    Next();
  }

  void OnDone() override { delete this; }

 private:
  // Writes the next chunk, or finishes after the last one (the first is written even when the
  // file is empty, for its header).
  void Next() {
    std::string buffer(kArtifactChunkBytes, '\0');
    const size_t n = std::fread(buffer.data(), 1, buffer.size(), file_);
    if (n == 0 && std::ferror(file_)) {
      return Finish({grpc::StatusCode::DATA_LOSS, "artifact read error"});
    }
    if (n == 0 && !chunk_.has_header()) return Finish(grpc::Status::OK);
    buffer.resize(n);
    chunk_.set_data(std::move(buffer));
    StartWrite(&chunk_);
  }

  std::FILE* file_ = nullptr;
  pb::ArtifactChunk chunk_;
};

class AgentServiceImpl final : public pb::AgentService::CallbackService {
 public:
  AgentServiceImpl(ControllerCore& core, Authenticator* auth) : core_(core), auth_(auth) {}

  grpc::ServerBidiReactor<pb::AgentMessage, pb::ControllerMessage>* Connect(
      grpc::CallbackServerContext* context) override {
    return new AgentStream(context, core_, auth_);
  }

  grpc::ServerReadReactor<pb::ArtifactChunk>* PutArtifact(grpc::CallbackServerContext* context,
                                                          pb::ArtifactStored* response) override {
    return new ArtifactUpload(context, core_, auth_, response);
  }

  grpc::ServerWriteReactor<pb::ArtifactChunk>* GetArtifact(
      grpc::CallbackServerContext* context, const pb::ArtifactRequest* request) override {
    return new ArtifactDownload(context, core_, auth_, request);
  }

 private:
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
