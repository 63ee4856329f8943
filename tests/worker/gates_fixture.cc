#include "gates_fixture.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>

#include "common/phases.h"
#include "common/sha256.h"
#include "gatehouse/worker/adamw.h"
#include "gatehouse/worker/bars.h"
#include "gatehouse/worker/reference.h"
#include "gatehouse/worker/safetensors_torch.h"

namespace gatehouse::worker::testing {

namespace fs = std::filesystem;


Fixture::Fixture(FixtureOptions opts) : options(std::move(opts)) {
  checkpoint_dir = dir.path() / "checkpoint";
  reference_dir = dir.path() / "reference";
  attempt_dir = dir.path() / "attempt";
  fs::create_directories(checkpoint_dir);
  fs::create_directories(reference_dir);
  fs::create_directories(attempt_dir);
  auto family = std::make_unique<FakeFamily>(options.fake);
  const FakeFamily& fam = *family;
  if (!registry.Register(std::move(family)).ok()) throw std::runtime_error("register fake");

  config = FakeConfig(options.tie);
  auto parsed = fam.ParseConfig(config);
  if (!parsed.ok()) throw std::runtime_error(parsed.status().ToString());
  torch::manual_seed(options.seed);
  args = parsed->args;
  model = *fam.Construct(*parsed->args, torch::kFloat32, torch::kCPU);
  auto adapter = fam.Adapter(*parsed->args);
  if (!adapter.ok()) throw std::runtime_error(adapter.status().ToString());
  for (const auto& item : model->named_parameters()) {
    auto hf = adapter->ToHf(item.key());
    if (!hf.ok()) throw std::runtime_error(hf.status().ToString());
    tensors[*hf] = item.value().detach().clone();
  }
  for (int64_t len : options.prompt_lengths) {
    prompts.push_back(torch::randint(0, parsed->args->vocab_size(), {len}, torch::kLong));
  }
}

void Fixture::Write() {
  WriteCheckpoint();
  WriteReference(*model);
}

void Fixture::WriteCheckpoint() {
  std::vector<std::pair<std::string, torch::Tensor>> list(tensors.begin(), tensors.end());
  Status s = safetensors::WriteTensors(checkpoint_dir / "model.safetensors", list, {{"format", "pt"}});
  if (!s.ok()) throw std::runtime_error(s.ToString());
  std::ofstream(checkpoint_dir / "config.json") << config.dump(2);
}

std::shared_ptr<CausalLM> Fixture::CopyOf(CausalLM& source, torch::Dtype dtype) const {
  const ModelFamily* fam = registry.FindByName("fake");
  std::shared_ptr<CausalLM> copy = *fam->Construct(*args, dtype, torch::kCPU);
  torch::NoGradGuard no_grad;
  auto from = source.named_parameters();
  for (auto& item : copy->named_parameters()) item.value().copy_(from[item.key()]);
  return copy;
}

namespace {

/// The training gate's procedure on `model` (a copy: it is trained), recorded as upstream's
/// trace is (reference.h TrainingTrace), names through the fake family's adapter.
nlohmann::json TraceOf(CausalLM& model, const StateDictAdapter& adapter,
                       const std::vector<torch::Tensor>& prompts, int64_t steps, double lr) {
  std::vector<torch::Tensor> params;
  std::vector<std::string> keys;
  std::vector<torch::Tensor> initial;
  for (auto& item : model.named_parameters()) {
    params.push_back(item.value());
    keys.push_back(*adapter.ToHf(item.key()));
    initial.push_back(item.value().detach().clone());
  }
  UpstreamAdamW::Options options;
  options.lr = lr;
  UpstreamAdamW optimizer(params, options);
  model.train();
  nlohmann::json losses = nlohmann::json::array(), norms = nlohmann::json::object();
  nlohmann::json sums = nlohmann::json::object();
  nlohmann::json first_changed = nlohmann::json::object();
  for (const auto& k : keys) first_changed[k] = nullptr;
  for (int64_t step = 1; step <= steps; ++step) {
    const torch::Tensor& ids = prompts[static_cast<size_t>(step - 1) % prompts.size()];
    const int64_t t = ids.size(0);
    optimizer.ZeroGrad();
    torch::Tensor logits = model.Forward(ids.slice(0, 0, t - 1).unsqueeze(0),
                                         torch::arange(t - 1, torch::kLong).unsqueeze(0), nullptr)
                               .to(torch::kFloat);
    torch::Tensor loss = torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}),
                                                              ids.slice(0, 1, t));
    loss.backward();
    losses.push_back(loss.item<double>());
    if (step == 1) {
      for (size_t i = 0; i < params.size(); ++i) {
        const torch::Tensor& g = params[i].grad();
        norms[keys[i]] = g.defined() ? g.to(torch::kDouble).norm().item<double>() : 0.0;
        sums[keys[i]] = g.defined() ? g.to(torch::kDouble).sum().item<double>() : 0.0;
      }
    }
    optimizer.Step();
    for (size_t i = 0; i < params.size(); ++i) {
      if (first_changed[keys[i]].is_null() && !torch::equal(params[i], initial[i])) {
        first_changed[keys[i]] = step;
      }
    }
  }
  model.eval();
  std::vector<std::string> trainable(keys);
  std::sort(trainable.begin(), trainable.end());
  return {{"losses", losses},
          {"grad_norms", norms},
          {"grad_sums", sums},
          {"trainable", trainable},
          {"first_changed_step", first_changed},
          {"floor", {{"implementations", nlohmann::json::array()},
                     {"grad_norm_rel", 0.0},
                     {"loss_rel", std::vector<double>(static_cast<size_t>(steps), 0.0)}}}};
}

}  // namespace

void Fixture::WriteReference(CausalLM& source) {
  constexpr int64_t kTraceSteps = 4;
  constexpr double kTraceLr = 1e-3;
  torch::NoGradGuard no_grad;
  source.eval();
  std::vector<std::pair<std::string, torch::Tensor>> list;
  nlohmann::json meta_prompts = nlohmann::json::array();
  const std::shared_ptr<CausalLM> source_bf16 = CopyOf(source, torch::kBFloat16);
  auto pos = [](int64_t n) { return torch::arange(n, torch::kLong).unsqueeze(0); };
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string p = "prompts." + std::to_string(i) + ".";
    const torch::Tensor& ids = prompts[i];
    const int64_t t = ids.size(0);
    list.emplace_back(p + "input_ids", ids);
    for (const auto& [suffix, m] : {std::pair<std::string, CausalLM*>{"", &source},
                                    std::pair<std::string, CausalLM*>{"_bf16", source_bf16.get()}}) {
      torch::Tensor logits = m->Forward(ids.unsqueeze(0), pos(t), nullptr)[0].to(torch::kFloat);
      torch::Tensor seq = ids.clone();
      std::vector<int64_t> greedy;
      for (int64_t n = 0; n < options.max_new_tokens; ++n) {
        torch::Tensor l = m->Forward(seq.unsqueeze(0), pos(seq.size(0)), nullptr);
        torch::Tensor next = l[0][-1].argmax();
        greedy.push_back(next.item<int64_t>());
        seq = torch::cat({seq, next.view({1})});
      }
      const torch::Tensor greedy_ids = torch::tensor(greedy, torch::kLong);
      const torch::Tensor forced = seq.slice(0, 0, seq.size(0) - 1);
      const torch::Tensor continuation =
          m->Forward(forced.unsqueeze(0), pos(forced.size(0)), nullptr)[0]
              .slice(0, t - 1)
              .to(torch::kFloat);
      list.emplace_back(p + "logits" + suffix, logits.contiguous());
      list.emplace_back(p + "greedy_ids" + suffix, greedy_ids);
      list.emplace_back(p + "decode_logits" + suffix,
                        ForcedDecodeLogits(*m, ids, greedy_ids, torch::kCPU).contiguous());
      list.emplace_back(p + "continuation_logits" + suffix, continuation.contiguous());
    }
    meta_prompts.push_back({{"text", "prompt " + std::to_string(i)}});
  }
  Status s = safetensors::WriteTensors(reference_dir / "reference.safetensors", list);
  if (!s.ok()) throw std::runtime_error(s.ToString());

  const ModelFamily* fam = registry.FindByName("fake");
  auto adapter = fam->Adapter(*args);
  if (!adapter.ok()) throw std::runtime_error(adapter.status().ToString());
  nlohmann::json training{{"steps", kTraceSteps}, {"lr", kTraceLr}, {"seed", 1234},
                          {"optimizer", "UpstreamAdamW (the fixture's stand-in for upstream)"}};
  {
    torch::AutoGradMode grad(true);
    training["fp32"] = TraceOf(*CopyOf(source, torch::kFloat32), *adapter, prompts, kTraceSteps, kTraceLr);
    training["bf16"] = TraceOf(*CopyOf(source, torch::kBFloat16), *adapter, prompts, kTraceSteps, kTraceLr);
  }
  const nlohmann::json no_floor{{"max_abs_diff", 0.0}, {"kl_mean", 0.0}, {"steps", 0}};
  nlohmann::json meta{{"format", kReferenceFormat},
                      {"prompts", meta_prompts},
                      {"device", options.reference_device.empty() ? "cpu" : options.reference_device},
                      {"cpu_capability", CpuCapability()},
                      {"num_threads", options.reference_threads > 0 ? options.reference_threads
                                                                    : torch::get_num_threads()},
                      {"decode_floor", {{"fp32", no_floor}, {"bf16", no_floor}}},
                      {"training", training}};
  std::ofstream(reference_dir / "reference.json") << meta.dump(2);
}

nlohmann::json Fixture::SpecJson() const {
  const std::string sha(40, 'a');
  // The digests the controller would freeze (the identity gate recomputes them).
  auto digest = [](const fs::path& dir) {
    Result<std::string> d = DirectoryDigest(dir);
    return d.ok() ? *d : std::string("sha256:missing");
  };
  return {
      {"spec_version", 1},
      {"repository", "/tmp/adaptation"},
      {"commit", sha},
      {"model_family", "fake"},
      {"checkpoint", {{"path", checkpoint_dir.string()}, {"digest", digest(checkpoint_dir)}}},
      {"reference", {{"path", reference_dir.string()}, {"digest", digest(reference_dir)}}},
      {"runtime", {{"torch", StripLocalVersion(TORCH_VERSION)}, {"device", "cpu"}}},
      {"launch", {{"runner", "gatehouse-worker"}, {"processes_per_rank", 1}}},
      {"topology", {{"tp", 1}, {"dp", 1}, {"pp", 1}, {"ep", 1}}},
      {"precision", "fp32"},
      {"mode", "eager"},
      {"decode", {{"max_new_tokens", options.max_new_tokens}, {"sampling", "greedy"}}},
      {"training", {{"steps", 2}, {"lr", 0.001}, {"seed", 1234}}},
      {"env", nlohmann::json::object()},
      {"phases", std::vector<std::string>(kDefaultPhases.begin(), kDefaultPhases.end())},
      {"attempt",
       {{"id", 7},
        {"dir", attempt_dir.string()},
        {"checkout", {{"head", sha}, {"clean", true}, {"path", "/tmp/adaptation"}}},
        {"agent", "test-agent"}}},
  };
}

GateContext Fixture::Context() const {
  GateContext ctx;
  auto spec = ParseRunSpec(SpecJson());
  if (!spec.ok()) throw std::runtime_error(spec.status().ToString());
  ctx.spec = *spec;
  ctx.registry = &registry;
  ctx.runtime = ProbeRuntime();
  return ctx;
}

GateOutcome RunThrough(GateContext& ctx, std::string_view last) {
  for (const GateDef& def : DefaultGates()) {
    GateOutcome out = def.fn(ctx);
    if (def.phase == last) return out;
    if (StopsLaterPhases(out.status)) {
      ADD_FAILURE() << "phase " << def.phase << " ended " << GateStatusName(out.status) << ": "
                    << out.reason;
      return out;
    }
  }
  ADD_FAILURE() << "no phase " << last;
  return {};
}

}  // namespace gatehouse::worker::testing
