// gatehouse-bench: times a model family's forward (prefill) and one training step on the CPU,
// for comparison with transformers (tools/bench/hf_peer.py; driver tools/bench/run.py).
//
//   gatehouse-bench --plugin libgatehouse_models.so --checkpoint DIR [--dtype fp32|bf16]
//                   [--batch 1] [--seq 256] [--threads 2] [--warmup 2] [--reps 5]
//                   [--seed 0] [--lr 1e-4] [--profile-trace FILE]
//
// The model is reached only through the worker SDK, as the worker reaches it: the plugin is
// dlopen()ed with LoadPlugin, the family is found by config.json's model_type, and the weights
// are loaded with LoadStateDict (the load gate's code), which must report full coverage.
//
// Measured (each repetition timed on its own with a steady clock; CPU only, so no sync):
//  - forward: model.eval(), NoGradGuard, Forward(tokens [B, T], positions 0..T-1, no cache);
//    prefill tokens/s = B * T / seconds.
//  - train step: model.train(); AdamW.zero_grad; Forward(tokens[:, :-1]); cross_entropy of the
//    logits (as float32) against tokens[:, 1:]; backward; AdamW.step (lr, default betas, eps
//    and weight decay 0.01: torch.optim.AdamW's defaults). The same as the training gate.
// Tokens are torch::randint(vocab, [B, T]) after torch::manual_seed(seed): the same ids the
// Python peer draws with torch.randint after torch.manual_seed(seed) (same CPU generator).
//
// Standard output: one JSON object (side, dtype, threads, shapes, per-repetition ms, medians).
// Exit status: 0 on success, 1 on any error (message on standard error), 2 for a bad command
// line.
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "gatehouse/worker/checkpoint.h"
#include "gatehouse/worker/gates.h"
#include "gatehouse/worker/model_family.h"
#include "gatehouse/worker/plugin_loader.h"
#include "gatehouse/worker/state_dict_adapter.h"

namespace gatehouse::bench {
namespace {

using worker::CausalLM;

struct Options {
  std::string plugin;
  std::string checkpoint;
  std::string dtype = "fp32";
  int64_t batch = 1;
  int64_t seq = 256;
  int threads = 2;
  int warmup = 2;
  int reps = 5;
  int64_t seed = 0;
  double lr = 1e-4;
  std::string profile_trace;  // empty: no profile
};

double NowMs() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

/// CPU time (user + system) this process has used, all threads, in ms.
double ProcessCpuMs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) { return 1000.0 * t.tv_sec + t.tv_usec / 1000.0; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

/// Median of `xs` (non-empty); the mean of the two middle values for an even count.
double Median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 == 1 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

/// The loaded model and what the benchmark needs to feed it.
struct LoadedModel {
  std::shared_ptr<CausalLM> model;
  int64_t vocab_size = 0;
  std::string model_type;
  std::string family;
};

/// Plugin -> family (by model_type) -> ParseConfig -> Construct -> Adapter -> LoadStateDict.
Result<LoadedModel> Load(const Options& o, worker::FamilyRegistry& registry, torch::Dtype dtype) {
  GH_RETURN_IF_ERROR(worker::LoadPlugin(o.plugin, registry));
  GH_ASSIGN_OR_RETURN(worker::Checkpoint ckpt, worker::Checkpoint::Open(o.checkpoint));
  const auto& config = ckpt.config();
  if (!config.contains("model_type") || !config["model_type"].is_string()) {
    return Status::InvalidArgument("config.json has no string model_type");
  }
  const std::string model_type = config["model_type"].get<std::string>();
  const worker::ModelFamily* family = registry.FindByModelType(model_type);
  if (family == nullptr) {
    return Status::NotFound("no family registered for model_type " + model_type);
  }
  GH_ASSIGN_OR_RETURN(worker::ParsedConfig parsed, family->ParseConfig(config));
  GH_ASSIGN_OR_RETURN(std::shared_ptr<CausalLM> model,
                      family->Construct(*parsed.args, dtype, torch::kCPU));
  GH_ASSIGN_OR_RETURN(worker::StateDictAdapter adapter, family->Adapter(*parsed.args));
  GH_ASSIGN_OR_RETURN(worker::LoadReport report, worker::LoadStateDict(ckpt, adapter, *model));
  if (!report.ok()) {
    return Status::FailedPrecondition(
        "checkpoint does not load cleanly: " + std::to_string(report.missing.size()) +
        " missing, " + std::to_string(report.unexpected.size()) + " unexpected, " +
        std::to_string(report.shape_mismatches.size()) + " shape mismatches, " +
        std::to_string(report.nonfinite.size()) + " non-finite");
  }
  return LoadedModel{std::move(model), parsed.args->vocab_size(), model_type,
                     std::string(family->name())};
}

/// Positions [B, T] int64: 0..T-1 on every row.
torch::Tensor Positions(int64_t b, int64_t t) {
  return torch::arange(t, torch::kLong).unsqueeze(0).expand({b, t}).contiguous();
}

/// Wall time of each timed repetition, and the share of the CPUs it was given.
struct Timing {
  std::vector<double> ms;
  /// Process CPU time (all threads) of each timed repetition, ms.
  std::vector<double> cpu_ms;
  /// Process CPU time over (wall time x threads) across the timed repetitions: about 1 when
  /// the threads ran undisturbed, lower when other processes took the cores.
  double cpu_share = 0;
};

/// Runs `fn` warmup times untimed, then reps times timed.
template <typename Fn>
Timing Time(int warmup, int reps, int threads, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  Timing t;
  const double cpu0 = ProcessCpuMs();
  double wall = 0;
  for (int i = 0; i < reps; ++i) {
    const double c0 = ProcessCpuMs();
    const double t0 = NowMs();
    fn();
    t.ms.push_back(NowMs() - t0);
    t.cpu_ms.push_back(ProcessCpuMs() - c0);
    wall += t.ms.back();
  }
  t.cpu_share = (ProcessCpuMs() - cpu0) / (wall * threads);
  return t;
}

Result<nlohmann::json> Run(const Options& o) {
  torch::Dtype dtype;
  if (o.dtype == "fp32") {
    dtype = torch::kFloat32;
  } else if (o.dtype == "bf16") {
    dtype = torch::kBFloat16;
  } else {
    return Status::InvalidArgument("--dtype must be fp32 or bf16, got " + o.dtype);
  }
  if (o.seq < 2 || o.batch < 1 || o.reps < 1 || o.warmup < 0 || o.threads < 1) {
    return Status::InvalidArgument("need --seq >= 2, --batch >= 1, --reps >= 1, --threads >= 1");
  }
  torch::set_num_threads(o.threads);
  worker::FamilyRegistry registry;
  GH_ASSIGN_OR_RETURN(LoadedModel lm, Load(o, registry, dtype));
  CausalLM& model = *lm.model;

  torch::manual_seed(static_cast<uint64_t>(o.seed));
  const torch::Tensor tokens = torch::randint(lm.vocab_size, {o.batch, o.seq}, torch::kLong);
  const torch::Tensor positions = Positions(o.batch, o.seq);
  const torch::Tensor inputs = tokens.slice(1, 0, o.seq - 1).contiguous();
  const torch::Tensor labels = tokens.slice(1, 1, o.seq).reshape({-1});
  const torch::Tensor train_positions = Positions(o.batch, o.seq - 1);

  // --- forward (prefill) ---------------------------------------------------------------
  model.eval();
  Timing fwd;
  {
    torch::NoGradGuard no_grad;
    fwd = Time(o.warmup, o.reps, o.threads, [&] { model.Forward(tokens, positions, nullptr); });
  }

  // --- training step ---------------------------------------------------------------------
  std::vector<torch::Tensor> params;
  for (auto& g : worker::UniqueParameters(model)) {
    if (g.tensor.requires_grad()) params.push_back(g.tensor);
  }
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(o.lr));
  model.train();
  double last_loss = 0;
  auto train_step = [&] {
    optimizer.zero_grad();
    const torch::Tensor logits = model.Forward(inputs, train_positions, nullptr).to(torch::kFloat);
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), labels);
    loss.backward();
    optimizer.step();
    last_loss = loss.item<double>();
  };
  const Timing train = Time(o.warmup, o.reps, o.threads, train_step);

  // --- optional op-level profile: one forward and one training step ----------------------
  if (!o.profile_trace.empty()) {
    torch::autograd::profiler::RecordProfile guard(o.profile_trace);
    {
      RECORD_FUNCTION("bench::forward", std::vector<c10::IValue>());
      torch::NoGradGuard no_grad;
      model.eval();
      model.Forward(tokens, positions, nullptr);
    }
    {
      RECORD_FUNCTION("bench::train_step", std::vector<c10::IValue>());
      model.train();
      train_step();
    }
  }

  nlohmann::json j;
  j["side"] = "gatehouse";
  j["family"] = lm.family;
  j["model_type"] = lm.model_type;
  j["dtype"] = o.dtype;
  j["threads"] = torch::get_num_threads();
  j["batch"] = o.batch;
  j["seq"] = o.seq;
  j["warmup"] = o.warmup;
  j["reps"] = o.reps;
  j["torch"] = worker::ProbeRuntime().torch_version;
  j["forward_ms"] = fwd.ms;
  j["train_step_ms"] = train.ms;
  j["forward_cpu_ms"] = fwd.cpu_ms;
  j["train_step_cpu_ms"] = train.cpu_ms;
  j["forward_cpu_share"] = fwd.cpu_share;
  j["train_step_cpu_share"] = train.cpu_share;
  j["forward_ms_median"] = Median(fwd.ms);
  j["train_step_ms_median"] = Median(train.ms);
  j["prefill_tokens_per_s"] = 1000.0 * static_cast<double>(o.batch * o.seq) / Median(fwd.ms);
  j["train_tokens_per_s"] =
      1000.0 * static_cast<double>(o.batch * (o.seq - 1)) / Median(train.ms);
  j["last_loss"] = last_loss;
  return j;
}

}  // namespace
}  // namespace gatehouse::bench

int main(int argc, char** argv) {
  gatehouse::bench::Options o;
  CLI::App app{"Times a Gatehouse model family's forward and training step on the CPU"};
  app.add_option("--plugin", o.plugin, "model-family plugin shared library")->required();
  app.add_option("--checkpoint", o.checkpoint, "HF checkpoint directory")->required();
  app.add_option("--dtype", o.dtype, "fp32 or bf16");
  app.add_option("--batch", o.batch, "batch size B");
  app.add_option("--seq", o.seq, "sequence length T (the training step uses T-1 inputs)");
  app.add_option("--threads", o.threads, "intra-op threads (torch::set_num_threads)");
  app.add_option("--warmup", o.warmup, "untimed iterations before each measurement");
  app.add_option("--reps", o.reps, "timed repetitions (the median is reported)");
  app.add_option("--seed", o.seed, "seed of the random token ids");
  app.add_option("--lr", o.lr, "AdamW learning rate");
  app.add_option("--profile-trace", o.profile_trace,
                 "write a Chrome trace (legacy autograd profiler) of one forward and one "
                 "training step to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return e.get_exit_code() == 0 ? rc : 2;
  }
  try {
    gatehouse::Result<nlohmann::json> r = gatehouse::bench::Run(o);
    if (!r.ok()) {
      std::cerr << "gatehouse-bench: " << r.status().ToString() << "\n";
      return 1;
    }
    std::cout << r->dump() << std::endl;
  } catch (const std::exception& e) {  // c10::Error from LibTorch: the edge turns it into rc 1
    std::cerr << "gatehouse-bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
