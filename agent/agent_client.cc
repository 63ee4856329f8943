// gRPC transport of the agent: the Connect stream, registration, heartbeats, assignments.
#include "agent/agent_client.h"

#include <algorithm>
#include <cstdio>
#include <thread>
#include <random>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "common/file_util.h"
#include "common/sha256.h"
#include "gatehouse/agent/v1/agent.grpc.pb.h"

namespace gatehouse::agent {
namespace {

namespace pb = ::gatehouse::agent::v1;

/// 16 random bytes in hex (std::random_device: the kernel's generator on Linux).
std::string NewInstanceId() {
  std::random_device device;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 8; ++i) {
    const unsigned v = device();
    for (int k = 0; k < 4; ++k) id += kHex[(v >> (4 * k)) & 15];
  }
  return id;
}

pb::Capabilities ToProto(const AgentCapabilities& caps) {
  pb::Capabilities out;
  out.set_cpu_cores(caps.cpu_cores);
  out.set_memory_bytes(caps.memory_bytes);
  for (const GpuInfo& gpu : caps.gpus) {
    pb::Gpu* g = out.add_gpus();
    g->set_model(gpu.model);
    g->set_memory_bytes(gpu.memory_bytes);
    g->set_uuid(gpu.uuid);
    g->set_index(gpu.index);
    g->set_driver_version(gpu.driver_version);
  }
  for (const auto& [key, value] : caps.labels) (*out.mutable_labels())[key] = value;
  out.set_torch_version(caps.torch_version);
  out.set_cuda_version(caps.cuda_version);
  out.set_nccl_version(caps.nccl_version);
  out.set_cudnn_version(caps.cudnn_version);
  out.set_cuda_driver_version(caps.cuda_driver_version);
  out.set_slots(caps.slots);
  out.set_transformers_version(caps.transformers_version);
  return out;
}

}  // namespace

/// AttemptSink over the stream. Called from the runner thread only.
class AgentClient::StreamSink : public AttemptSink {
 public:
  explicit StreamSink(AgentClient& client) : client_(client) {}

  void Event(int64_t attempt_id, int64_t seq, std::string_view json) override {
    pb::AgentMessage message;
    pb::AttemptEvent* event = message.mutable_event();
    event->set_attempt_id(attempt_id);
    event->set_seq(seq);
    event->set_json(std::string(json));
    Send(message, "event");
  }

  void Log(int64_t attempt_id, std::string_view stream, int64_t offset,
           std::string_view data) override {
    pb::AgentMessage message;
    pb::LogChunk* chunk = message.mutable_log();
    chunk->set_attempt_id(attempt_id);
    chunk->set_stream(std::string(stream));
    chunk->set_offset(offset);
    chunk->set_data(std::string(data));
    Send(message, "log chunk");
  }

  void End(const AttemptEndReport& report) override {
    client_.PublishDrainState();  // before the end: the controller schedules on it
    pb::AgentMessage message;
    pb::AttemptEnd* end = message.mutable_end();
    end->set_attempt_id(report.attempt_id);
    end->set_seq(report.seq);
    end->set_outcome(report.outcome);
    end->set_reason(report.reason);
    end->set_exit_code(report.exit_code);
    end->set_oom_limit_bytes(report.oom_limit_bytes);
    Send(message, "end");
  }

 private:
  void Send(const pb::AgentMessage& message, const char* what) {
    (void)what;
    const int64_t attempt_id = message.has_event() ? message.event().attempt_id()
                               : message.has_log() ? message.log().attempt_id()
                                                   : message.end().attempt_id();
    client_.Send(attempt_id, message);
  }

  AgentClient& client_;
};

AgentClient::AgentClient(AgentClientConfig config, AttemptRunner& runner)
    : config_(std::move(config)),
      instance_id_(NewInstanceId()),
      runner_(runner),
      sink_(std::make_unique<StreamSink>(*this)) {}

AgentClient::~AgentClient() {
  Stop();
  if (runner_thread_.joinable()) runner_thread_.join();
}

void AgentClient::Stop() {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  stopping_ = true;
  cancel_running_ = true;
  if (context_ != nullptr) context_->TryCancel();
  cv_.notify_all();
}

int64_t AgentClient::RunningAttempt() const {
  std::lock_guard lock(mu_);
  return running_attempt_;
}

bool AgentClient::Write(const pb::AgentMessage& message) {
  std::lock_guard lock(write_mu_);
  return stream_ != nullptr && stream_->Write(message);
}

void AgentClient::Send(int64_t attempt_id, const pb::AgentMessage& message) {
  bool written = false;
  const bool kept = outbox_.Send(attempt_id, message.SerializeAsString(), message.has_log(),
                                 [&](const std::string&) { return written = Write(message); });
  if (!kept) {
    spdlog::warn("attempt {}: resend buffer full ({} MiB): log chunk {}@{} is not kept for resending",
                 attempt_id, kMaxOutboxBytes >> 20, message.log().stream(), message.log().offset());
  } else if (!written) {
    spdlog::debug("controller stream down: attempt {} message kept for resending", attempt_id);
  }
}

void AgentClient::AttachAndReplay(Stream* stream) {
  const size_t sent = outbox_.Replay(
      [&] {
        std::lock_guard write_lock(write_mu_);
        stream_ = stream;
      },
      [&](const std::string& bytes) {
        pb::AgentMessage message;
        message.ParseFromString(bytes);
        return Write(message);
      });
  if (sent > 0) spdlog::info("resent {} unacknowledged message(s) after registering", sent);
}

void AgentClient::Acknowledge(int64_t attempt_id) { outbox_.Acknowledge(attempt_id); }

std::vector<int64_t> AgentClient::HeldAttempts() const {
  std::vector<int64_t> held;
  {
    std::lock_guard lock(mu_);
    if (running_attempt_ != 0) held.push_back(running_attempt_);
    for (const QueuedAttempt& q : queue_) held.push_back(q.assignment.attempt_id);
  }
  for (const int64_t id : outbox_.Attempts()) held.push_back(id);
  std::sort(held.begin(), held.end());
  held.erase(std::unique(held.begin(), held.end()), held.end());
  return held;
}

Status AgentClient::Run() {
  runner_thread_ = std::thread([this] { RunnerLoop(); });
  int failures = 0;
  while (true) {
    bool registered = false;
    const Status ended = Session(registered);
    if (registered) failures = 0;
    if ((ended.code() == StatusCode::kUnauthenticated ||
         ended.code() == StatusCode::kPermissionDenied) &&
        HeldAttempts().empty()) {
      spdlog::error("{}", ended.message());
      {
        std::lock_guard lock(mu_);
        stopping_ = true;
        cv_.notify_all();
      }
      if (runner_thread_.joinable()) runner_thread_.join();
      return ended;
    }
    std::unique_lock lock(mu_);
    if (stopping_) break;
    const std::chrono::milliseconds backoff =
        std::min(config_.max_backoff, config_.initial_backoff * (1 << std::min(failures, 16)));
    ++failures;
    spdlog::warn("controller {}: {}; reconnecting in {} ms", config_.controller, ended.ToString(),
                 backoff.count());
    cv_.wait_for(lock, backoff, [this] { return stopping_; });
    if (stopping_) break;
  }
  if (runner_thread_.joinable()) runner_thread_.join();
  return Status::Ok();
}

Result<std::shared_ptr<grpc::ChannelCredentials>> AgentClient::Credentials() const {
  if (!config_.tls) {
    if (!config_.tls_ca_file.empty() || !config_.tls_cert_file.empty()) {
      return Status::InvalidArgument("TLS files given but TLS is off");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  if (!config_.tls_ca_file.empty()) {
    auto ca = ReadFileToString(config_.tls_ca_file, "TLS CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = std::move(*ca);
  }
  if (config_.tls_cert_file.empty() != config_.tls_key_file.empty()) {
    return Status::InvalidArgument("a TLS client certificate needs both --tls-cert and --tls-key");
  }
  if (!config_.tls_cert_file.empty()) {
    auto cert = ReadFileToString(config_.tls_cert_file, "TLS client certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadFileToString(config_.tls_key_file, "TLS client key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = std::move(*cert);
    ssl.pem_private_key = std::move(*key);
  }
  return grpc::SslCredentials(ssl);
}

Status AgentClient::Session(bool& registered) {
  auto credentials = Credentials();
  if (!credentials.ok()) return credentials.status();
  auto channel = grpc::CreateChannel(config_.controller, *credentials);
  auto stub = pb::AgentService::NewStub(channel);
  grpc::ClientContext context;
  if (!config_.token.empty()) context.AddMetadata("authorization", "Bearer " + config_.token);
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Status::Unavailable("stopping");
    context_ = &context;
    session_over_ = false;
  }
  std::unique_ptr<Stream> stream = stub->Connect(&context);

  // A controller that never answers Register would hold Read() forever: cancel the call.
  std::thread watchdog([this, &context, &registered] {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, config_.register_timeout,
                      [this, &registered] { return registered || session_over_ || stopping_; })) {
      context.TryCancel();
    }
  });
  const auto end_session = [&](Status why) {
    {
      std::lock_guard lock(write_mu_);
      stream_ = nullptr;
    }
    {
      std::lock_guard lock(mu_);
      session_over_ = true;
      cv_.notify_all();
    }
    watchdog.join();
    const grpc::Status finished = stream->Finish();
    {
      std::lock_guard lock(mu_);
      context_ = nullptr;
    }
    if (finished.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      return Status::Unauthenticated("controller refused the agent token: " +
                                     finished.error_message());
    }
    if (finished.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      return Status::PermissionDenied("controller refused the agent token: " +
                                      finished.error_message());
    }
    if (!finished.ok()) {
      why = Status(why.code(), why.message() + " (grpc code " +
                                   std::to_string(finished.error_code()) + ": " +
                                   finished.error_message() + ")");
    }
    return why;
  };

  pb::AgentMessage hello;
  pb::Register* reg = hello.mutable_register_();
  reg->set_agent_name(config_.agent_name);
  reg->set_instance_id(instance_id_);
  *reg->mutable_capabilities() = ToProto(config_.capabilities);
  for (const int64_t held : HeldAttempts()) reg->add_running_attempt_ids(held);
  {
    std::lock_guard lock(mu_);
    reg->set_drain_reason(drain_reason_);
  }
  pb::ControllerMessage reply;
  if (!stream->Write(hello)) return end_session(Status::Unavailable("cannot send Register"));
  if (!stream->Read(&reply)) return end_session(Status::Unavailable("stream closed before Registered"));
  if (!reply.has_registered()) {
    context.TryCancel();
    return end_session(Status::FailedPrecondition("first controller message is not Registered"));
  }
  const std::string agent_id = reply.registered().agent_id();
  auto interval = std::chrono::milliseconds(reply.registered().heartbeat_interval_ms());
  if (interval.count() <= 0) interval = config_.default_heartbeat;
  {
    std::lock_guard lock(mu_);
    registered = true;
    cv_.notify_all();
  }
  spdlog::info("registered with {} as {} (heartbeat every {} ms)", config_.controller, agent_id,
               interval.count());
  AttachAndReplay(stream.get());
  if (on_registered_) on_registered_(agent_id);

  std::thread heartbeat([this, interval] { HeartbeatLoop(interval); });
  while (stream->Read(&reply)) HandleMessage(reply);
  const Status ended = end_session(Status::Unavailable("stream ended"));
  heartbeat.join();
  return ended;
}

void AgentClient::HeartbeatLoop(std::chrono::milliseconds interval) {
  int64_t seq = 0;
  while (true) {
    pb::AgentMessage message;
    {
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, interval, [this] { return session_over_ || stopping_; })) return;
      pb::Heartbeat* heartbeat = message.mutable_heartbeat();
      heartbeat->set_seq(++seq);
      if (running_attempt_ != 0) heartbeat->add_running_attempt_ids(running_attempt_);
      heartbeat->set_drain_reason(drain_reason_);
    }
    if (!Write(message)) return;  // the reader sees the broken stream and reconnects
  }
}

void AgentClient::HandleMessage(const pb::ControllerMessage& message) {
  if (message.has_end_ack()) {
    Acknowledge(message.end_ack().attempt_id());
    return;
  }
  std::lock_guard lock(mu_);
  if (message.has_assignment()) {
    const pb::Assignment& a = message.assignment();
    const bool known = a.attempt_id() == running_attempt_ ||
                       std::any_of(queue_.begin(), queue_.end(), [&](const QueuedAttempt& q) {
                         return q.assignment.attempt_id == a.attempt_id();
                       });
    if (known) {
      spdlog::info("attempt {}: assigned again; already running or queued", a.attempt_id());
      return;
    }
    spdlog::info("attempt {}: assigned (cell {}, branch {})", a.attempt_id(), a.cell_id(), a.branch());
    AttemptAssignment assignment{a.attempt_id(), a.cell_id(), a.spec_json(), {}};
    for (const pb::InputArtifact& in : a.inputs()) {
      assignment.inputs.push_back({in.role(), in.name(), in.digest(), in.size()});
    }
    assignment.memory_estimate_bytes = a.memory_estimate_bytes();
    assignment.memory_estimate = a.memory_estimate();
    queue_.push_back({std::move(assignment), false, ""});
    cv_.notify_all();
  } else if (message.has_cancel()) {
    const pb::Cancel& c = message.cancel();
    spdlog::info("attempt {}: cancel requested: {}", c.attempt_id(), c.reason());
    if (c.attempt_id() == running_attempt_) {
      cancel_running_ = true;
      return;
    }
    for (QueuedAttempt& q : queue_) {
      if (q.assignment.attempt_id == c.attempt_id()) {
        q.cancelled = true;
        q.cancel_reason = c.reason();
      }
    }
  } else if (message.has_registered()) {
    spdlog::warn("ignoring a second Registered message");
  }
}

void AgentClient::PublishDrainState() {
  pb::AgentMessage message;
  {
    std::lock_guard lock(mu_);
    if (drain_reason_ == runner_.drain_reason()) return;
    drain_reason_ = runner_.drain_reason();
    message.mutable_heartbeat()->set_drain_reason(drain_reason_);
    if (running_attempt_ != 0) message.mutable_heartbeat()->add_running_attempt_ids(running_attempt_);
  }
  // Not kept for resending: Register carries the drain state after a reconnect.
  (void)Write(message);
}

bool AgentClient::WaitUntilHealthy() {
  while (!runner_.healthy()) {
    // Work that reached this agent before the controller heard it drains (or that the
    // controller placed before it heard) is not run: it ends at once, so it is not held here
    // while the drain lasts.
    std::deque<QueuedAttempt> refused;
    {
      std::lock_guard lock(mu_);
      refused.swap(queue_);
    }
    for (const QueuedAttempt& q : refused) {
      AttemptEndReport end;
      end.attempt_id = q.assignment.attempt_id;
      end.seq = 1;
      end.outcome = std::string(kOutcomeError);
      end.reason = q.cancelled ? "cancelled: " + q.cancel_reason
                               : "not run: this agent drains (" + runner_.drain_reason() + ")";
      sink_->End(end);
    }
    {
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, config_.drain_recheck, [this] { return stopping_; })) return false;
    }
    runner_.Recheck();
    PublishDrainState();
  }
  return true;
}

void AgentClient::RunnerLoop() {
  while (true) {
    // A draining agent runs nothing (an assignment that crossed the drain notice waits).
    if (!WaitUntilHealthy()) return;
    QueuedAttempt next;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      next = std::move(queue_.front());
      queue_.pop_front();
      running_attempt_ = next.assignment.attempt_id;
      cancel_running_ = false;
    }
    if (next.cancelled) {
      AttemptEndReport end;
      end.attempt_id = next.assignment.attempt_id;
      end.seq = 1;
      end.outcome = std::string(kOutcomeError);
      end.reason = next.cancel_reason.rfind("cancelled", 0) == 0 ? next.cancel_reason
                                                                 : "cancelled: " + next.cancel_reason;
      sink_->End(end);
    } else {
      runner_.Run(next.assignment, *sink_, CancelToken{&cancel_running_, config_.kill_grace});
    }
    std::lock_guard lock(mu_);
    running_attempt_ = 0;
  }
}

namespace {

constexpr size_t kArtifactChunkBytes = size_t{1} << 20;

// How long one artifact transfer may take: a minute plus a second per MiB (a link slower than
// 1 MiB/s, or a stalled controller, ends the call instead of holding the attempt forever).
std::chrono::system_clock::time_point ArtifactDeadline(int64_t bytes) {
  return std::chrono::system_clock::now() + std::chrono::seconds(60 + (std::max<int64_t>(bytes, 0) >> 20));
}

Status FromGrpc(const grpc::Status& s, const std::string& what) {
  const std::string message = what + ": " + s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::NOT_FOUND: return Status::NotFound(message);
    case grpc::StatusCode::DATA_LOSS: return Status::DataLoss(message);
    case grpc::StatusCode::INVALID_ARGUMENT: return Status::InvalidArgument(message);
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return Status::ResourceExhausted(message);
    case grpc::StatusCode::PERMISSION_DENIED: return Status::PermissionDenied(message);
    case grpc::StatusCode::UNAUTHENTICATED: return Status::Unauthenticated(message);
    case grpc::StatusCode::FAILED_PRECONDITION: return Status::FailedPrecondition(message);
    case grpc::StatusCode::ALREADY_EXISTS: return Status::AlreadyExists(message);
    default: return Status::Unavailable(message);
  }
}

}  // namespace

Status AgentClient::Put(int64_t attempt_id, const std::string& name,
                        const std::filesystem::path& path) {
  auto digest = Sha256FileHex(path);
  if (!digest.ok()) return digest.status();
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return Status::NotFound("artifact " + path.string() + ": " + ec.message());
  auto backoff = config_.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    auto credentials = Credentials();
    if (!credentials.ok()) return credentials.status();
    auto stub = pb::AgentService::NewStub(grpc::CreateChannel(config_.controller, *credentials));
    grpc::ClientContext context;
    if (!config_.token.empty()) context.AddMetadata("authorization", "Bearer " + config_.token);
    context.set_deadline(ArtifactDeadline(static_cast<int64_t>(size)));
    pb::ArtifactStored stored;
    auto writer = stub->PutArtifact(&context, &stored);
    pb::ArtifactChunk chunk;
    pb::ArtifactHeader* header = chunk.mutable_header();
    header->set_attempt_id(attempt_id);
    header->set_agent_name(config_.agent_name);
    header->set_name(name);
    header->set_digest("sha256:" + *digest);
    header->set_size(static_cast<int64_t>(size));
    std::FILE* file = std::fopen(path.c_str(), "rb");
    if (file == nullptr) return Status::NotFound("artifact " + path.string() + ": cannot open");
    std::string buffer(kArtifactChunkBytes, '\0');
    bool written = true;
    for (bool first = true;; first = false) {
      const size_t n = std::fread(buffer.data(), 1, buffer.size(), file);
      if (n == 0 && !first) break;
      chunk.set_data(buffer.data(), n);
      if (!writer->Write(chunk)) {
        written = false;
        break;
      }
      chunk.clear_header();
      if (n < buffer.size()) break;
    }
    std::fclose(file);
    if (written) writer->WritesDone();
    const grpc::Status status = writer->Finish();
    if (status.ok()) return Status::Ok();
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || attempt >= 3) {
      return FromGrpc(status, "PutArtifact '" + name + "'");
    }
    spdlog::warn("attempt {}: storing artifact '{}' failed ({}); retrying", attempt_id, name,
                 status.error_message());
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, config_.max_backoff);
  }
}

Status AgentClient::Get(const std::string& digest, int64_t size,
                        const std::filesystem::path& dest) {
  auto credentials = Credentials();
  if (!credentials.ok()) return credentials.status();
  auto stub = pb::AgentService::NewStub(grpc::CreateChannel(config_.controller, *credentials));
  grpc::ClientContext context;
  if (!config_.token.empty()) context.AddMetadata("authorization", "Bearer " + config_.token);
  context.set_deadline(ArtifactDeadline(size));
  pb::ArtifactRequest request;
  request.set_digest(digest);
  auto reader = stub->GetArtifact(&context, request);
  const std::filesystem::path tmp = dest.string() + ".part";
  std::FILE* file = std::fopen(tmp.c_str(), "wb");
  if (file == nullptr) return Status::Internal("cannot create " + tmp.string());
  Sha256 sha;
  int64_t received = 0;
  pb::ArtifactChunk chunk;
  bool write_ok = true;
  while (reader->Read(&chunk)) {
    const std::string& data = chunk.data();
    if (received + static_cast<int64_t>(data.size()) > size) {
      context.TryCancel();  // more than announced: stop reading, the check below refuses it
      received += static_cast<int64_t>(data.size());
      break;
    }
    write_ok = write_ok && std::fwrite(data.data(), 1, data.size(), file) == data.size();
    sha.Update(data);
    received += static_cast<int64_t>(data.size());
  }
  write_ok = std::fclose(file) == 0 && write_ok;
  const grpc::Status status = reader->Finish();
  std::error_code ec;
  if (received > size) {
    std::filesystem::remove(tmp, ec);
    return Status::DataLoss("received more than the announced " + std::to_string(size) +
                            " bytes of " + digest);
  }
  if (!status.ok() || !write_ok) {
    std::filesystem::remove(tmp, ec);
    return status.ok() ? Status::Internal("cannot write " + tmp.string())
                       : FromGrpc(status, "GetArtifact " + digest);
  }
  const std::string actual = "sha256:" + sha.FinalHex();
  if (actual != digest || received != size) {
    std::filesystem::remove(tmp, ec);
    return Status::DataLoss("received " + std::to_string(received) + " bytes with digest " +
                            actual + ", expected " + std::to_string(size) + " bytes with " +
                            digest);
  }
  std::filesystem::rename(tmp, dest, ec);
  if (ec) return Status::Internal("cannot move " + tmp.string() + " into place: " + ec.message());
  return Status::Ok();
}

}  // namespace gatehouse::agent
