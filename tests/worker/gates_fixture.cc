#include "gates_fixture.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>

#include <fstream>

#include "common/phases.h"
#include "common/sha256.h"
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

void Fixture::WriteReference(CausalLM& source) {
  torch::NoGradGuard no_grad;
  source.eval();
  std::vector<std::pair<std::string, torch::Tensor>> list;
  nlohmann::json meta_prompts = nlohmann::json::array();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string p = "prompts." + std::to_string(i) + ".";
    const torch::Tensor& ids = prompts[i];
    const int64_t t = ids.size(0);
    auto pos = [](int64_t n) { return torch::arange(n, torch::kLong).unsqueeze(0); };
    torch::Tensor logits = source.Forward(ids.unsqueeze(0), pos(t), nullptr)[0].to(torch::kFloat);
    torch::Tensor seq = ids.clone();
    std::vector<int64_t> greedy;
    for (int64_t n = 0; n < options.max_new_tokens; ++n) {
      torch::Tensor l = source.Forward(seq.unsqueeze(0), pos(seq.size(0)), nullptr);
      torch::Tensor next = l[0][-1].argmax();
      greedy.push_back(next.item<int64_t>());
      seq = torch::cat({seq, next.view({1})});
    }
    list.emplace_back(p + "input_ids", ids);
    list.emplace_back(p + "logits", logits.contiguous());
    if (options.bf16_logits) {
      list.emplace_back(p + "logits_bf16", logits.to(torch::kBFloat16).to(torch::kFloat).contiguous());
    }
    list.emplace_back(p + "greedy_ids", torch::tensor(greedy, torch::kLong));
    meta_prompts.push_back({{"text", "prompt " + std::to_string(i)}});
  }
  Status s = safetensors::WriteTensors(reference_dir / "reference.safetensors", list);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  nlohmann::json meta{{"format", kReferenceFormat}, {"prompts", meta_prompts}};
  if (!options.reference_device.empty()) meta["device"] = options.reference_device;
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
