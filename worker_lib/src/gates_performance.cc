// The performance gate (gates.h PerformanceGate): our prefill, decode (eager, and CUDA-graph on
// a CUDA device), training step and peak memory next to transformers' on the same checkpoint,
// prompt, precision, device and thread count, measured in the same run, as ratios.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "gatehouse/worker/cuda_graph.h"
#include "gatehouse/worker/gates.h"
#include "gates_internal.h"

extern char** environ;

namespace gatehouse::worker {

using internal::NowMsSteady;
using internal::Positions;
using internal::SyncDevice;

namespace {

constexpr int kWarmup = 2;
constexpr int kReps = 5;

/// Median wall ms of `reps` runs of `fn` after `warmup` runs (device synchronised).
template <typename Fn>
double MedianMs(torch::Device device, Fn&& fn) {
  for (int i = 0; i < kWarmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < kReps; ++i) {
    SyncDevice(device);
    const double t0 = NowMsSteady();
    fn();
    SyncDevice(device);
    ms.push_back(NowMsSteady() - t0);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// Runs argv (no shell; argv[0] looked up in PATH when it has no slash) with standard output
/// captured and standard error inherited (it lands in the worker's log). Errors: UNAVAILABLE
/// when it cannot start, INTERNAL naming the exit status when it does not exit 0.
Result<std::string> RunCaptured(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::Unavailable("pipe() failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return Status::Unavailable("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Internal(argv[0] + " " + argv[1] + " ended with status " +
                            std::to_string(WIFEXITED(status) ? WEXITSTATUS(status)
                                                             : 128 + WTERMSIG(status)));
  }
  return out;
}

/// The peer's script: GATEHOUSE_PEER_SCRIPT, else tools/bench/hf_peer.py of the Gatehouse
/// source tree this worker was built from.
std::string PeerScript() {
  if (const char* s = std::getenv("GATEHOUSE_PEER_SCRIPT"); s != nullptr && *s) return s;
  return std::string(GATEHOUSE_SOURCE_DIR) + "/tools/bench/hf_peer.py";
}

double Num(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

GateOutcome PerformanceGate(GateContext& ctx) {
  GateOutcome out;
  if (!internal::RequireLoadedModel(ctx, out) || !internal::RequireReference(ctx, out)) return out;
  const ReferencePrompt* prompt = nullptr;
  for (const auto& p : ctx.reference->prompts) {
    if (p.input_ids.size(0) >= 2) {
      prompt = &p;
      break;
    }
  }
  if (prompt == nullptr) return out.Unknown("no reference prompt has 2 or more tokens");
  CausalLM& model = *ctx.model;
  const torch::Device device = ctx.device;
  const int64_t t = prompt->input_ids.size(0);
  const int64_t n = std::max<int64_t>(ctx.spec.decode.max_new_tokens, 2);
  const int device_index = device.is_cuda() ? device.index() < 0 ? 0 : device.index() : 0;
  const torch::Tensor tokens = prompt->input_ids.unsqueeze(0).to(device);
  out.Count("prompt_tokens", t);
  out.Count("decode_tokens", n);
  out.Count("threads", torch::get_num_threads());

  // Ours. Decode first: the training step below changes the weights.
  CudaResetPeakMemory(device_index);
  model.eval();
  double ours_prefill_ms;
  {
    torch::NoGradGuard no_grad;
    ours_prefill_ms = MedianMs(device, [&] { model.Forward(tokens, Positions(0, t, device), nullptr); });
  }
  double ours_decode_ms = 0;
  GreedyDecode(model, prompt->input_ids, n, device, &ours_decode_ms);  // warm-up
  GreedyDecode(model, prompt->input_ids, n, device, &ours_decode_ms);
  // Graph decode (cuda_graph.h) on the same prompt, when there is a device to capture on and a
  // static step to capture; otherwise the figure is absent and `graph_decode` says why.
  double ours_graph_ms = 0;
  if (!device.is_cuda()) {
    out.Text("graph_decode", "not measured: device " + device.str() + " (CUDA graphs need CUDA)");
  } else if (!model.SupportsStaticDecode()) {
    out.Text("graph_decode", "not measured: the model has no static decode step");
  } else {
    Result<std::unique_ptr<CudaGraphDecoder>> graph = CudaGraphDecoder::Create(model, 1, t + n);
    Result<torch::Tensor> ids = graph.ok() ? (*graph)->Generate(tokens, n, &ours_graph_ms)  // warm-up
                                           : Result<torch::Tensor>(graph.status());
    if (ids.ok()) ids = (*graph)->Generate(tokens, n, &ours_graph_ms);
    if (ids.ok()) {
      out.Real("graph_decode_ms_per_token", ours_graph_ms, "ms");
    } else {
      out.Text("graph_decode", "not measured: " + ids.status().ToString());
      ours_graph_ms = 0;
    }
  }
  std::vector<torch::Tensor> params;
  for (auto& g : UniqueParameters(model)) {
    if (g.tensor.requires_grad()) params.push_back(g.tensor);
  }
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(ctx.spec.training.lr));
  const torch::Tensor inputs = tokens.slice(1, 0, t - 1);
  const torch::Tensor labels = tokens.slice(1, 1, t).reshape({-1});
  model.train();
  const double ours_train_ms = MedianMs(device, [&] {
    optimizer.zero_grad();
    const torch::Tensor logits = model.Forward(inputs, Positions(0, t - 1, device), nullptr).to(torch::kFloat);
    torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), labels).backward();
    optimizer.step();
  });
  model.eval();
  const int64_t ours_peak = CudaPeakAllocatedBytes(device_index);
  const double ours_prefill_tps = 1000.0 * double(t) / ours_prefill_ms;
  out.Real("prefill_tokens_per_s", ours_prefill_tps, "tokens/s");
  out.Real("decode_ms_per_token", ours_decode_ms, "ms");
  out.Real("train_step_ms", ours_train_ms, "ms");
  if (device.is_cuda()) out.Bytes("peak_memory_bytes", ours_peak);

  // The peer: transformers, eager attention (the reference bundle's), in its own process.
  const char* python = std::getenv("GATEHOUSE_PEER_PYTHON");
  if (python == nullptr || *python == '\0') {
    return out.Blocked(
        "no transformers peer: GATEHOUSE_PEER_PYTHON is not set (a Python with torch and "
        "transformers; the agent's environment reaches the worker)");
  }
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(ctx.spec.attempt.dir) / "performance";
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path ids_file = dir / "prompt_ids.json";
  {
    const torch::Tensor ids = prompt->input_ids.contiguous();
    std::ofstream f(ids_file);
    f << nlohmann::json(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + t)).dump();
  }
  Result<std::string> peer_out = RunCaptured(
      {python, PeerScript(), "--checkpoint", ctx.spec.checkpoint.path, "--dtype", ctx.spec.precision,
       "--attn", "eager", "--device", device.is_cuda() ? "cuda" : "cpu", "--tokens-file",
       ids_file.string(), "--decode-tokens", std::to_string(n), "--threads",
       std::to_string(torch::get_num_threads()), "--warmup", std::to_string(kWarmup), "--reps",
       std::to_string(kReps), "--lr", std::to_string(ctx.spec.training.lr)});
  if (!peer_out.ok()) {
    return out.Blocked("transformers peer did not run: " + peer_out.status().message() +
                       " (its standard error is in the worker log)");
  }
  const nlohmann::json peer = nlohmann::json::parse(*peer_out, nullptr, false);
  if (!peer.is_object() || Num(peer, "prefill_tokens_per_s") <= 0) {
    return out.Blocked("transformers peer printed no measurement: " + peer_out->substr(0, 200));
  }
  out.Text("peer", "transformers " + peer.value("transformers", std::string("?")) + ", torch " +
                       peer.value("torch", std::string("?")) + ", eager attention");
  const double peer_tps = Num(peer, "prefill_tokens_per_s");
  const double peer_decode = Num(peer, "decode_ms_per_token");
  const double peer_train = Num(peer, "train_step_ms_median");
  out.Real("peer_prefill_tokens_per_s", peer_tps, "tokens/s");
  out.Real("peer_decode_ms_per_token", peer_decode, "ms");
  out.Real("peer_train_step_ms", peer_train, "ms");
  // Ratios > 1: Gatehouse is faster (or, for memory, uses more).
  out.Real("prefill_speedup", ours_prefill_tps / peer_tps, "ratio");
  if (ours_decode_ms > 0 && peer_decode > 0) out.Real("decode_speedup", peer_decode / ours_decode_ms, "ratio");
  if (ours_graph_ms > 0 && peer_decode > 0) {
    out.Real("graph_decode_speedup", peer_decode / ours_graph_ms, "ratio");
  }
  if (ours_train_ms > 0 && peer_train > 0) out.Real("train_step_speedup", peer_train / ours_train_ms, "ratio");
  if (device.is_cuda()) {
    const double peer_peak = Num(peer, "peak_memory_bytes");
    out.Bytes("peer_peak_memory_bytes", static_cast<int64_t>(peer_peak));
    if (peer_peak > 0) out.Real("peak_memory_ratio", double(ours_peak) / peer_peak, "ratio");
  }
  return out;
}

}  // namespace gatehouse::worker
