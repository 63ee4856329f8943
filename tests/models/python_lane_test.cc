// The Python lane (worker_lib/python_lane) through the real gates: the reference adapters in
// adapters/python/gh_archon (llama, qwen3_moe, Archon's layout) registered as families by
// gatehouse_python_lane_register, exactly as the worker does, then every llama and qwen3_moe
// fixture from config to save in fp32 and bf16 against transformers' bundle; and adapters
// broken the ways adapters break, each caught by its gate with a reason naming the fault.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "gatehouse/worker/gates.h"
#include "gatehouse/worker/model_family.h"
#include "tests/common/temp_dir.h"
#include "tests/models/family_test_util.h"
#include "tests/worker/gloo_ranks.h"
#include "worker_lib/python_lane/python_lane.h"

namespace gatehouse::worker {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// A registry holding the Python-lane families of `entries`, with `sys_path` in front; a
/// registration error fails the calling test and leaves the registry empty.
std::unique_ptr<FamilyRegistry> LaneRegistry(const std::vector<std::string>& entries,
                                             const std::vector<std::string>& sys_path) {
  auto registry = std::make_unique<FamilyRegistry>();
  const std::string config = json{{"entries", entries}, {"sys_path", sys_path}}.dump();
  char error[4096] = {0};
  const int rc = gatehouse_python_lane_register(registry.get(), config.c_str(), error, sizeof(error));
  EXPECT_EQ(rc, 0) << error;
  return registry;
}

/// The reference adapters' registry (built once).
const FamilyRegistry& ArchonRegistry() {
  static const FamilyRegistry* registry =
      LaneRegistry({"gh_archon.llama.spec:SPEC", "gh_archon.qwen3_moe.spec:SPEC"},
                   {GATEHOUSE_ADAPTERS_DIR})
          .release();
  return *registry;
}

/// variant -> family of the fixtures whose family is in `families` (the .done stamps).
std::map<std::string, std::string> Fixtures(const std::set<std::string>& families) {
  std::map<std::string, std::string> out;
  if (!fs::is_directory(test_util::TestdataDir())) return out;
  for (const auto& entry : fs::directory_iterator(test_util::TestdataDir())) {
    std::ifstream in(entry.path() / ".done");
    if (!in) continue;
    const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    const std::string family = j["variant"].value("family", "");
    if (families.count(family)) out[entry.path().filename().string()] = family;
  }
  return out;
}

/// One fixture through config .. save with `registry`'s families.
test_util::PhaseOutcomes RunFixture(const FamilyRegistry& registry, const std::string& variant,
                                    const std::string& family, const std::string& precision) {
  test_util::TempDir attempt;
  return test_util::RunFixtureGates(registry, variant, family, precision, attempt.path());
}

double Real(const GateOutcome& out, const char* name) {
  const Figure* f = out.Find(name);
  return f != nullptr && std::holds_alternative<double>(f->value) ? std::get<double>(f->value)
                                                                   : std::nan("");
}

int64_t Count(const GateOutcome& out, const char* name) {
  const Figure* f = out.Find(name);
  return f != nullptr && std::holds_alternative<int64_t>(f->value) ? std::get<int64_t>(f->value)
                                                                    : -1;
}

TEST(PythonLane, RegistersTheSpecsAsFamilies) {
  const FamilyRegistry& registry = ArchonRegistry();
  ASSERT_NE(registry.FindByName("llama"), nullptr);
  ASSERT_NE(registry.FindByModelType("qwen3_moe"), nullptr);
  EXPECT_TRUE(registry.FindByName("llama")->MapsWeightsByCode());
}

TEST(PythonLane, BadEntriesAreNamed) {
  for (const auto& [entry, expect] : std::vector<std::pair<std::string, std::string>>{
           {"gh_archon.llama.spec", "expected 'package.module:ATTRIBUTE'"},
           {"gh_archon.no_such_module:SPEC", "No module named 'gh_archon.no_such_module'"},
           {"gh_archon.llama.spec:NOPE", "has no NOPE"},
           {"gh_archon.llama.spec:build_model", "expected a gatehouse_adapter.ModelSpec"}}) {
    FamilyRegistry registry;
    const std::string config =
        json{{"entries", json::array({entry})},
             {"sys_path", json::array({std::string(GATEHOUSE_ADAPTERS_DIR)})}}
            .dump();
    char error[4096] = {0};
    EXPECT_EQ(gatehouse_python_lane_register(&registry, config.c_str(), error, sizeof(error)), 1)
        << entry;
    EXPECT_NE(std::string(error).find(expect), std::string::npos) << entry << ": " << error;
    EXPECT_TRUE(registry.Names().empty()) << entry;
  }
}

/// Every llama and qwen3_moe fixture, fp32 and bf16, passes every gate from config to save
/// with the Python adapters, on the same CPU kernels as the bundle's: logits, losses and
/// step-1 gradients equal transformers' to the last bit, as the C++ families' do
/// (families_test). With GATEHOUSE_FIGURES_JSON set, every gate's figures are written there
/// (tools/parity reads them for the Python-lane column).
TEST(PythonLane, EveryGatePassesOnTheReferenceAdaptersFixtures) {
  const auto fixtures = Fixtures({"llama", "qwen3_moe"});
  if (fixtures.empty()) GTEST_SKIP() << "no fixture: run through ctest";
  json record = json::object();
  for (const auto& [variant, family] : fixtures) {
    if (variant.find("-real-") != std::string::npos) continue;  // real sizes: real_size.py
    for (const std::string precision : {"fp32", "bf16"}) {
      const auto outcomes = RunFixture(ArchonRegistry(), variant, family, precision);
      record[variant][precision] = test_util::OutcomesJson(outcomes);
      ASSERT_FALSE(outcomes.empty());
      const auto& [last_phase, last] = outcomes.back();
      EXPECT_TRUE(last_phase == "save" && last.status == GateStatus::kPass)
          << variant << " " << precision << " " << last_phase << ": "
          << GateStatusName(last.status) << " " << last.reason;
      for (const auto& [phase, out] : outcomes) {
        if (out.status != GateStatus::kPass) continue;
        if (phase == "load") {
          EXPECT_EQ(test_util::FigureText(out, "weight_mapping"),
                    "code: from_hf, proved by to_hf(from_hf(checkpoint))");
          EXPECT_EQ(test_util::FigureText(out, "keys_used"), test_util::FigureText(out, "keys_total"))
              << variant;
        }
        if (phase == "inference") EXPECT_EQ(Real(out, "max_abs_diff"), 0.0) << variant << " " << precision;
        if (phase == "decode") {
          // The adapters' own KV cache. bf16 steps equal upstream's cached decode's; fp32 ones
          // are held by the gate's bars, as the C++ families' are (families_test): the
          // bundle's first row is generate's head over the last position alone, ours the
          // prompt forward's row T-1, and MKL rounds the two shapes differently on some CPUs
          // (docs/bars.md; test_archon_adapters.py checks the steps bit for bit).
          EXPECT_EQ(test_util::FigureText(out, "decode_path"), "KV cache") << variant;
          if (precision == "bf16") {
            EXPECT_EQ(Real(out, "steps_max_abs_diff"), 0.0) << variant << " " << precision;
          }
        }
        if (phase == "training") {
          EXPECT_EQ(Real(out, "loss_rel_diff_step_1"), 0.0) << variant << " " << precision;
        }
      }
    }
  }
  if (const char* path = std::getenv("GATEHOUSE_FIGURES_JSON")) {
    std::ofstream(path) << record.dump(1) << "\n";
  }
}

/// A Python package in a temporary directory whose SPEC is the llama reference adapter with
/// one method of its state-dict adapter replaced by `body` (Python source of a subclass body).
class BrokenAdapter {
 public:
  /// `name`: the package's name, unique per case (Python keeps imported modules by name).
  BrokenAdapter(const std::string& name, const std::string& body) {
    const fs::path pkg = dir_.path() / name;
    fs::create_directories(pkg);
    std::ofstream(pkg / "__init__.py") << "";
    std::ofstream(pkg / "spec.py")
        << "import dataclasses\n"
           "from gh_archon.llama.spec import SPEC as _GOOD\n"
           "from gh_archon.llama.model.state_dict_adapter import LlamaStateDictAdapter\n"
           "class Broken(LlamaStateDictAdapter):\n"
        << body << "\nSPEC = dataclasses.replace(_GOOD, state_dict_adapter=Broken)\n";
    registry_ = LaneRegistry({name + ".spec:SPEC"},
                             {dir_.path().string(), GATEHOUSE_ADAPTERS_DIR});
  }
  const FamilyRegistry& registry() const { return *registry_; }

 private:
  test_util::TempDir dir_;
  std::unique_ptr<FamilyRegistry> registry_;
};

struct Broken {
  const char* what;
  const char* body;
  const char* phase;   // the gate that must catch it
  const char* reason;  // a part of its reason
};

TEST(PythonLane, BrokenAdaptersFailAtTheirGate) {
  if (Fixtures({"llama"}).count("llama-tiny-untied") == 0) GTEST_SKIP() << "no fixture";
  const Broken cases[] = {
      {"from_hf drops a key",
       "    def from_hf(self, sd):\n"
       "        sd = dict(sd); sd.pop('model.norm.weight')\n"
       "        return super().from_hf(sd)\n",
       "load", "parameter norm.weight (from_hf assigns nothing to it)"},
      {"from_hf refuses a key",
       "    def from_hf(self, sd):\n"
       "        raise KeyError('model.layers.0.mlp.up_proj.weight is not mapped')\n",
       "load", "model.layers.0.mlp.up_proj.weight is not mapped"},
      {"from_hf transposes a square weight",
       "    def from_hf(self, sd):\n"
       "        out = super().from_hf(sd)\n"
       "        out['layers.0.attention.wo.weight'] = out['layers.0.attention.wo.weight'].t()\n"
       "        return out\n",
       "load", "model.layers.0.self_attn.o_proj.weight (to_hf(from_hf(checkpoint)) gives"},
      {"from_hf and to_hf swap the gate and up projections alike",
       "    _swap = {'w1': 'w3', 'w3': 'w1'}\n"
       "    def _s(self, d):\n"
       "        out = {}\n"
       "        for k, v in d.items():\n"
       "            parts = k.split('.')\n"
       "            out['.'.join(self._swap.get(p, p) for p in parts)] = v\n"
       "        return out\n"
       "    def from_hf(self, sd):\n"
       "        return self._s(super().from_hf(sd))\n"
       "    def to_hf(self, sd):\n"
       "        return super().to_hf(self._s(sd))\n",
       "inference", "max_abs_diff"},
  };
  int n = 0;
  for (const Broken& c : cases) {
    BrokenAdapter adapter("broken_llama_" + std::to_string(n++), c.body);
    const auto outcomes = RunFixture(adapter.registry(), "llama-tiny-untied", "llama", "fp32");
    ASSERT_FALSE(outcomes.empty()) << c.what;
    const auto& [phase, out] = outcomes.back();
    EXPECT_EQ(phase, c.phase) << c.what << ": " << out.reason;
    EXPECT_EQ(out.status, GateStatus::kFail) << c.what << ": " << out.reason;
    EXPECT_EQ(out.classification, FailureClass::kAdapterContract) << c.what;
    EXPECT_NE(out.reason.find(c.reason), std::string::npos) << c.what << ": " << out.reason;
  }
}

/// A Python package `name` in `dir` whose spec.py is `source` (after `import dataclasses`).
void WritePackage(const fs::path& dir, const std::string& name, const std::string& source) {
  fs::create_directories(dir / name);
  std::ofstream(dir / name / "__init__.py") << "";
  std::ofstream(dir / name / "spec.py") << "import dataclasses\n" << source;
}

/// ctx after config, construct and load of `variant` in `precision` with `registry`'s families;
/// a gate that does not pass fails the calling test.
struct LoadedFixture {
  test_util::TempDir attempt;
  GateContext ctx;
  LoadedFixture(const FamilyRegistry& registry, const std::string& variant,
                const std::string& family, const std::string& precision) {
    ctx.spec = test_util::FixtureRunSpec(test_util::FixtureDir(variant), family, precision,
                                         attempt.path());
    ctx.registry = &registry;
    for (const auto& [phase, gate] : test_util::GatesThrough("load")) {
      const GateOutcome out = gate(ctx);
      EXPECT_EQ(out.status, GateStatus::kPass) << phase << ": " << out.reason;
    }
  }
};

/// Logits [T, V] float of `tokens` ([T] int64) fed to `model` as a prefill of `prefill` tokens
/// then one cached step per token.
torch::Tensor CachedLogits(CausalLM& model, KVCache& cache, const torch::Tensor& tokens,
                           int64_t prefill) {
  torch::NoGradGuard no_grad;
  const int64_t t = tokens.size(0);
  std::vector<torch::Tensor> rows;
  rows.push_back(model.Forward(tokens.slice(0, 0, prefill).unsqueeze(0),
                               torch::arange(prefill, torch::kLong).unsqueeze(0), &cache)[0]);
  for (int64_t i = prefill; i < t; ++i) {
    rows.push_back(model.Forward(tokens.slice(0, i, i + 1).unsqueeze(0),
                                 torch::full({1, 1}, i, torch::kLong), &cache)[0]);
  }
  return torch::cat(rows).to(torch::kFloat);
}

/// A SPEC that gives init_cache / decode_forward makes a model that caches keys and values:
/// every cached Forward is one decode_forward call on the adapter's cache (a prefill, then one
/// token per step; a Reset handle gets a fresh init_cache), its logits are the whole-sequence
/// forward's, and the decode gate judges its steps as a KV cache's. The same adapter without
/// them falls back to recomputing the sequence, and the decode gate says so.
TEST(PythonLane, DecodesThroughTheAdaptersKvCacheWhenItGivesOne) {
  if (Fixtures({"llama"}).count("llama-tiny-untied") == 0) GTEST_SKIP() << "no fixture";
  test_util::TempDir dir;
  const fs::path calls = dir.path() / "calls.txt";
  // The reference llama adapter, its init_cache and decode_forward logged to calls.txt.
  WritePackage(dir.path(), "kv_counting_llama",
               "from gh_archon.llama.spec import SPEC as _GOOD\n"
               "LOG = " + json(calls.string()).dump() + "\n"
               "def init_cache(model, batch, max_len, dtype, device):\n"
               "    open(LOG, 'a').write(f'init {batch} {max_len} {dtype}\\n')\n"
               "    return _GOOD.init_cache(model, batch, max_len, dtype, device)\n"
               "def decode_forward(model, tokens, positions, cache):\n"
               "    open(LOG, 'a').write(f'decode {tokens.shape[1]} {int(positions[0, 0])}\\n')\n"
               "    return _GOOD.decode_forward(model, tokens, positions, cache)\n"
               "SPEC = dataclasses.replace(_GOOD, init_cache=init_cache, decode_forward=decode_forward)\n");
  WritePackage(dir.path(), "kv_absent_llama",
               "from gh_archon.llama.spec import SPEC as _GOOD\n"
               "SPEC = dataclasses.replace(_GOOD, init_cache=None, decode_forward=None)\n");
  const auto read_calls = [&calls] {
    std::ifstream in(calls);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    fs::remove(calls);
    return lines;
  };
  const std::vector<std::string> sys_path = {dir.path().string(), GATEHOUSE_ADAPTERS_DIR};
  const auto cached_registry = LaneRegistry({"kv_counting_llama.spec:SPEC"}, sys_path);
  const auto absent_registry = LaneRegistry({"kv_absent_llama.spec:SPEC"}, sys_path);
  const torch::Tensor tokens = torch::tensor({5, 17, 3, 99, 42, 7, 8, 200, 31, 64}, torch::kLong);
  const int64_t t = tokens.size(0), prefill = 6;

  LoadedFixture cached(*cached_registry, "llama-tiny-untied", "llama", "fp32");
  ASSERT_TRUE(cached.ctx.model_loaded);
  CausalLM& model = *cached.ctx.model;
  EXPECT_TRUE(model.CachesKeysAndValues());
  read_calls();
  torch::Tensor whole;
  {
    torch::NoGradGuard no_grad;
    whole = model.Forward(tokens.unsqueeze(0), torch::arange(t, torch::kLong).unsqueeze(0),
                          nullptr)[0].to(torch::kFloat);
  }
  EXPECT_TRUE(read_calls().empty()) << "a forward without a cache went through decode_forward";
  auto cache = model.NewKVCache(1, t);
  const torch::Tensor steps = CachedLogits(model, *cache, tokens, prefill);
  EXPECT_EQ(cache->length(), t);
  std::vector<std::string> want = {"init 1 " + std::to_string(t) + " torch.float32",
                                   "decode 6 0"};
  for (int64_t i = prefill; i < t; ++i) want.push_back("decode 1 " + std::to_string(i));
  EXPECT_EQ(read_calls(), want);
  // Other matmul shapes than the whole forward's: close, not necessarily equal.
  EXPECT_TRUE(torch::allclose(steps, whole, /*rtol=*/0, /*atol=*/1e-4))
      << (steps - whole).abs().max().item<double>();
  // A Reset handle starts a fresh cache of the adapter's; two live handles do not mix.
  cache->Reset();
  auto other = model.NewKVCache(1, t);
  const torch::Tensor again = CachedLogits(model, *cache, tokens, prefill);
  const torch::Tensor other_logits = CachedLogits(model, *other, tokens, 3);
  EXPECT_TRUE(torch::equal(again, steps));
  EXPECT_TRUE(torch::allclose(other_logits, whole, 0, 1e-4));
  EXPECT_EQ(read_calls().front(), "init 1 " + std::to_string(t) + " torch.float32");
  // Overflow is refused before the adapter is called.
  EXPECT_THROW(model.Forward(tokens.slice(0, 0, 1).unsqueeze(0),
                             torch::full({1, 1}, t, torch::kLong), cache.get()),
               c10::Error);
  EXPECT_TRUE(read_calls().empty());
  // Handles freed and made again (addresses reused) each get their own cache.
  for (int i = 0; i < 4; ++i) {
    auto c = model.NewKVCache(1, t);
    EXPECT_TRUE(torch::equal(CachedLogits(model, *c, tokens, prefill), steps)) << i;
  }

  const GateOutcome decode = DecodeGate(cached.ctx);
  EXPECT_EQ(decode.status, GateStatus::kPass) << decode.reason;
  EXPECT_EQ(test_util::FigureText(decode, "decode_path"), "KV cache");
  // fp32: the steps within the gate's bars (the first row's product shape, docs/bars.md); the
  // greedy ids all upstream's.
  EXPECT_GT(Count(decode, "tokens_total"), 0);
  EXPECT_EQ(Count(decode, "tokens_matched"), Count(decode, "tokens_total"));
  const std::vector<std::string> gate_calls = read_calls();
  EXPECT_GT(std::count_if(gate_calls.begin(), gate_calls.end(),
                          [](const std::string& l) { return l.rfind("decode 1 ", 0) == 0; }),
            0);

  LoadedFixture absent(*absent_registry, "llama-tiny-untied", "llama", "fp32");
  ASSERT_TRUE(absent.ctx.model_loaded);
  EXPECT_FALSE(absent.ctx.model->CachesKeysAndValues());
  auto fallback_cache = absent.ctx.model->NewKVCache(1, t);
  const torch::Tensor recomputed = CachedLogits(*absent.ctx.model, *fallback_cache, tokens, prefill);
  // The fallback recomputes the whole sequence: the last step is the whole forward's last row.
  EXPECT_TRUE(torch::equal(recomputed[t - 1], whole[t - 1]));
  EXPECT_TRUE(torch::allclose(recomputed, whole, 0, 1e-4));
  const GateOutcome fallback = DecodeGate(absent.ctx);
  EXPECT_EQ(fallback.status, GateStatus::kPass) << fallback.reason;
  EXPECT_NE(test_util::FigureText(fallback, "decode_path").find("whole sequence recomputed"),
            std::string::npos);
  EXPECT_TRUE(read_calls().empty());
}

/// init_cache without decode_forward (or the reverse) is refused when the entry is loaded.
TEST(PythonLane, AKvCacheNeedsBothHalves) {
  test_util::TempDir dir;
  WritePackage(dir.path(), "kv_half_llama",
               "from gh_archon.llama.spec import SPEC as _GOOD\n"
               "SPEC = dataclasses.replace(_GOOD, decode_forward=None)\n");
  FamilyRegistry registry;
  const std::string config =
      json{{"entries", json::array({"kv_half_llama.spec:SPEC"})},
           {"sys_path", json::array({dir.path().string(), std::string(GATEHOUSE_ADAPTERS_DIR)})}}
          .dump();
  char error[4096] = {0};
  EXPECT_EQ(gatehouse_python_lane_register(&registry, config.c_str(), error, sizeof(error)), 1);
  EXPECT_NE(std::string(error).find("needs both init_cache and decode_forward; decode_forward is None"),
            std::string::npos)
      << error;
}

/// What one worker process reported: its phase_end events and figures by phase, and run_end's
/// status.
struct WorkerRun {
  std::map<std::string, json> ends;
  std::map<std::string, std::map<std::string, json>> figures;  // phase -> name -> value
  std::string run_end;
  int exit_code = -1;
  /// A figure's value; json null when absent.
  json Figure(const std::string& phase, const std::string& name) const {
    auto p = figures.find(phase);
    if (p == figures.end()) return json();
    auto f = p->second.find(name);
    return f == p->second.end() ? json() : f->second;
  }
};

/// Runs the worker executable on the lane as the agent starts it (`--python-entry`,
/// `--python-path`, events on stdout) over `variant` (of model family `family`) in `precision`
/// through `phases`, as
/// `world` ranks with torchrun's variables (one process each, rendezvous on 127.0.0.1; a
/// topology of `dimension` = world, tp, dp or dp_shard, or several: "dp=2,tp=2") when world > 1. `sys_path` goes in front of the
/// reference adapters.
/// Returns each rank's events, rank 0 first; every process is bounded to 10 minutes.
std::vector<WorkerRun> RunWorker(const std::string& entry, const std::string& family,
                                 const std::string& variant, const std::string& precision,
                                 const std::vector<std::string>& phases, int world = 1,
                                 const std::string& sys_path = "",
                                 const std::string& dimension = "tp",
                                 const std::string& worker_flags = "") {
  test_util::TempDir attempt;
  json j = test_util::FixtureRunSpecJson(test_util::FixtureDir(variant), family, precision,
                                         attempt.path());
  if (dimension.find('=') == std::string::npos) {
    j["topology"][dimension] = world;
  } else {
    // "dp=2,tp=2": several dimensions.
    std::stringstream parts(dimension);
    for (std::string part; std::getline(parts, part, ',');) {
      const size_t eq = part.find('=');
      j["topology"][part.substr(0, eq)] = std::stoi(part.substr(eq + 1));
    }
  }
  j["phases"] = phases;
  std::ofstream(attempt.path() / "run.json") << j.dump();
  const std::string python_path =
      (sys_path.empty() ? "" : " --python-path " + sys_path) + " --python-path " + GATEHOUSE_ADAPTERS_DIR;
  const std::string worker = "timeout 600 " + std::string(GATEHOUSE_WORKER) + " --run-spec " +
                             (attempt.path() / "run.json").string() + " --python-entry " + entry +
                             python_path + (worker_flags.empty() ? "" : " " + worker_flags);
  std::string cmd;
  const std::string dir = attempt.path().string();
  if (world == 1) {
    // (A rendezvous at world size 1 too: --parallel-measure-only joins a group of one.)
    cmd = "export MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(test_util::FreePort()) + "; " +
          worker + " > " + dir + "/events0.jsonl 2> " + dir + "/log0.txt; echo $? > " + dir + "/rc0";
  } else {
    cmd = "export WORLD_SIZE=" + std::to_string(world) +
          " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(test_util::FreePort()) +
          " GATEHOUSE_GROUP_TIMEOUT_S=120; for r in $(seq " + std::to_string(world - 1) +
          " -1 0); do (RANK=$r LOCAL_RANK=$r " + worker + " > " + dir + "/events$r.jsonl 2> " +
          dir + "/log$r.txt; echo $? > " + dir + "/rc$r) & done; wait";
  }
  EXPECT_NE(std::system(("sh -c '" + cmd + "'").c_str()), -1) << cmd;
  std::vector<WorkerRun> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::ifstream events(attempt.path() / ("events" + std::to_string(r) + ".jsonl"));
    std::string line;
    while (std::getline(events, line)) {
      const json ev = json::parse(line, nullptr, false);
      if (ev.is_discarded()) continue;
      const std::string kind = ev.value("event", "");
      if (kind == "phase_end") out[r].ends[ev.value("phase", "")] = ev;
      if (kind == "figure") out[r].figures[ev.value("phase", "")][ev.value("name", "")] = ev["value"];
      if (kind == "run_end") out[r].run_end = ev.value("status", "");
    }
    std::ifstream(attempt.path() / ("rc" + std::to_string(r))) >> out[r].exit_code;
    if (out[r].run_end.empty()) {
      std::ifstream log(attempt.path() / ("log" + std::to_string(r) + ".txt"));
      ADD_FAILURE() << "rank " << r << " ended without run_end; its log:\n" << log.rdbuf();
    }
  }
  return out;
}

/// The worker executable on the lane, as the agent will start it: a good entry runs to PASS;
/// an entry that does not import fails the config gate naming it (the cell's evidence says why
/// no family was found).
TEST(PythonLane, WorkerRunsAnEntry) {
  if (Fixtures({"llama"}).count("llama-tiny-untied") == 0) GTEST_SKIP() << "no fixture";
  const std::vector<std::string> phases = {"config", "construct", "load", "inference"};
  const WorkerRun good = RunWorker("gh_archon.llama.spec:SPEC", "llama", "llama-tiny-untied", "fp32", phases)[0];
  EXPECT_EQ(good.run_end, "PASS");
  EXPECT_EQ(good.ends.at("inference").value("status", ""), "PASS");
  const WorkerRun bad = RunWorker("gh_archon.nope.spec:SPEC", "llama", "llama-tiny-untied", "fp32", phases)[0];
  EXPECT_EQ(bad.run_end, "FAIL");
  ASSERT_TRUE(bad.ends.count("config"));
  EXPECT_EQ(bad.ends.at("config").value("status", ""), "FAIL");
  EXPECT_NE(bad.ends.at("config").value("reason", "").find("No module named 'gh_archon.nope'"),
            std::string::npos)
      << bad.ends.at("config").dump();
}

/// The KV-cache mutations of the reference adapters (tools/mutations/python/py_kv_cache_*,
/// manifest.json), each applied to a copy of adapters/python and run by the worker as the
/// agent starts it: the training forward is untouched, so the inference gate passes, and the
/// decode gate FAILs on the cached steps' logits against upstream's cached decode.
TEST(PythonLane, KvCacheMutationsFailTheDecodeGate) {
  const auto fixtures = Fixtures({"llama", "qwen3_moe"});
  struct Case {
    const char* patch;
    const char* family;
    const char* variant;
  };
  const Case cases[] = {{"py_kv_cache_keys_before_rope.patch", "llama", "llama-tiny-untied"},
                        {"py_kv_cache_position_off_by_one.patch", "llama", "llama-tiny-untied"},
                        {"py_kv_cache_window_ignored.patch", "qwen3_moe", "qwen3_moe-tiny-sliding"}};
  for (const Case& c : cases) {
    if (!fixtures.count(c.variant)) {
      ADD_FAILURE() << "no fixture " << c.variant << ": run through ctest";
      continue;
    }
    test_util::TempDir dir;
    const fs::path copy = dir.path() / "adapters";
    fs::copy(GATEHOUSE_ADAPTERS_DIR, copy, fs::copy_options::recursive);
    const std::string apply = "cd " + copy.string() + " && git apply " +
                              (fs::path(GATEHOUSE_PYTHON_MUTATIONS_DIR) / c.patch).string();
    ASSERT_EQ(std::system(apply.c_str()), 0) << apply;
    const WorkerRun run =
        RunWorker(std::string("gh_archon.") + c.family + ".spec:SPEC", c.family, c.variant, "fp32",
                  {"config", "construct", "load", "inference", "decode"}, 1, copy.string())[0];
    ASSERT_TRUE(run.ends.count("decode")) << c.patch;
    EXPECT_EQ(run.ends.at("inference").value("status", ""), "PASS") << c.patch;
    const json& end = run.ends.at("decode");
    EXPECT_EQ(end.value("status", ""), "FAIL") << c.patch << ": " << end.dump();
    EXPECT_EQ(end.value("classification", ""), "adapter_contract") << c.patch;
    EXPECT_NE(end.value("reason", "").find("decode-step logits vs upstream's decode"),
              std::string::npos)
        << c.patch << ": " << end.dump();
    EXPECT_EQ(run.Figure("decode", "decode_path"), "KV cache") << c.patch;
  }
}

const std::vector<std::string> kParallelPhases = {"config", "construct", "load", "parallel"};

/// The parallel gate on the lane: two worker processes, each rank's interpreter joins
/// torch.distributed's gloo group through the worker's rendezvous and runs the reference
/// adapter's own parallelize (DTensor, Megatron style). TP=2 agrees with TP=1 within the bars,
/// each rank holds less than the whole model, and the gathered save is bit-equal.
TEST(PythonLane, ParallelGateRunsTheAdaptersParallelize) {
  const auto fixtures = Fixtures({"llama", "qwen3_moe"});
  for (const auto& [variant, family, precision] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"llama-tiny-untied", "llama", "fp32"},
           {"llama-tiny-tied", "llama", "bf16"},
           {"qwen3_moe-tiny-untied", "qwen3_moe", "fp32"}}) {
    if (!fixtures.count(variant)) {
      ADD_FAILURE() << "no fixture " << variant << ": run through ctest";
      continue;
    }
    const auto ranks = RunWorker("gh_archon." + family + ".spec:SPEC", family, variant, precision,
                                 kParallelPhases, /*world=*/2);
    ASSERT_TRUE(ranks[0].ends.count("parallel")) << variant;
    const json& end = ranks[0].ends.at("parallel");
    EXPECT_EQ(end.value("status", ""), "PASS") << variant << " " << precision << ": " << end.dump();
    EXPECT_EQ(ranks[1].ends.count("parallel") ? ranks[1].ends.at("parallel").value("status", "") : "",
              "PASS")
        << variant;
    // Exit status 0 after run_end: torch's thread-local Python objects (DTensor's caches) are
    // released with the GIL held (gatehouse_python_lane_before_exit).
    EXPECT_EQ(ranks[0].exit_code, 0) << variant;
    EXPECT_EQ(ranks[1].exit_code, 0) << variant;
    EXPECT_EQ(ranks[0].Figure("parallel", "max_abs_diff_across_ranks"), 0.0) << variant;
    EXPECT_EQ(ranks[0].Figure("parallel", "process_group"), "gloo");
    EXPECT_EQ(ranks[0].Figure("parallel", "sharded_by"), "the adapter's parallelize (torch.distributed DTensor)");
    const json full = ranks[0].Figure("parallel", "param_elements_tp1");
    ASSERT_TRUE(full.is_number()) << end.dump();
    for (const char* r : {"param_elements_rank0", "param_elements_rank1"}) {
      EXPECT_LT(ranks[0].Figure("parallel", r).get<int64_t>(), full.get<int64_t>()) << variant << " " << r;
    }
    EXPECT_GT(ranks[0].Figure("parallel", "save_tensors_equal").get<int64_t>(), 0) << variant;
    if (precision == "fp32") {
      EXPECT_LT(ranks[0].Figure("parallel", "kl_mean_vs_tp1").get<double>(), 1e-6) << variant;
    }
  }
}

/// A package `name` under `dir` whose spec.py imports the reference adapter's SPEC for `family`
/// as `_GOOD` (and dataclasses), then runs `body`, which defines SPEC.
void WriteSpecPackage(const fs::path& dir, const std::string& name, const std::string& family,
                      const std::string& body) {
  fs::create_directories(dir / name);
  std::ofstream(dir / name / "__init__.py") << "";
  std::ofstream(dir / name / "spec.py")
      << "import dataclasses\nfrom gh_archon." << family << ".spec import SPEC as _GOOD\n" << body;
}

/// Data parallelism on the lane: two worker processes, each holding the adapter's model
/// (build_model, from_hf), train two AdamW steps on their share of the reference prompts: with
/// the adapter's own data_parallel (FSDP2 fully_shard: the model reduce-scatters its gradients,
/// each rank holds and steps its dim-0 shards) or, for a SPEC without one, with the gate
/// replicating the model and all-reducing the gradients (dp=2) or also keeping each rank's
/// optimizer state to its dim-0 slices (dp_shard=2). The losses, the global grad norms and
/// every gradient agree with the single-rank control on rank 0, and the replicas stay
/// bit-equal.
// Verifies the parallel gate's measure-only mode on the lane (tools/bench/parallel_layouts.py
// --python-entry): at world size 1 the adapter's model trains as it loaded (no group to hand
// parallelize), at dp_shard=2 the adapter's FSDP2 shards it; every rank ends SKIPPED with the
// same step-1 loss as the single rank, FSDP2 holding half the parameters per rank.
TEST(PythonLane, MeasuredOnlyTrainsTheAdaptersLayout) {
  if (!Fixtures({"llama"}).count("llama-tiny-untied")) GTEST_SKIP() << "no fixture";
  const std::vector<std::string> phases = {"config", "construct", "load", "parallel"};
  const std::string entry = "gh_archon.llama.spec:SPEC";
  const auto alone = RunWorker(entry, "llama", "llama-tiny-untied", "fp32", phases, 1, "", "tp",
                               "--parallel-measure-only");
  const auto fsdp = RunWorker(entry, "llama", "llama-tiny-untied", "fp32", phases, 2, "", "dp_shard",
                              "--parallel-measure-only");
  for (const auto* run : {&alone, &fsdp}) {
    for (const WorkerRun& rank : *run) {
      ASSERT_TRUE(rank.ends.count("parallel"));
      const json& end = rank.ends.at("parallel");
      EXPECT_EQ(end.value("status", ""), "SKIPPED") << end.dump();
      EXPECT_NE(end.value("reason", "").find("measured only"), std::string::npos) << end.dump();
      EXPECT_EQ(rank.exit_code, 0);
    }
  }
  // FSDP2 gives each rank as many sequences (the batch cut once more than at world size 1):
  // the losses are the gate's own dp_shard=2 run's, the one the control is compared with.
  const auto gate = RunWorker(entry, "llama", "llama-tiny-untied", "fp32", phases, 2, "", "dp_shard");
  ASSERT_TRUE(gate[0].ends.count("parallel"));
  EXPECT_EQ(gate[0].ends.at("parallel").value("status", ""), "PASS");
  const int64_t params = alone[0].Figure("parallel", "parameter_elements_held").get<int64_t>();
  EXPECT_GT(alone[0].Figure("parallel", "loss_step_1").get<double>(), 0.0);
  for (const WorkerRun& rank : fsdp) {
    EXPECT_EQ(rank.Figure("parallel", "loss_step_1"), gate[0].Figure("parallel", "loss_step_1"));
    EXPECT_LT(rank.Figure("parallel", "parameter_elements_held").get<int64_t>(), params * 6 / 10);
  }
}

TEST(PythonLane, DataParallelTrainsLikeOneRank) {
  const auto fixtures = Fixtures({"llama"});
  if (!fixtures.count("llama-tiny-untied")) GTEST_SKIP() << "no fixture";
  test_util::TempDir dir;
  WriteSpecPackage(dir.path(), "gate_reduces", "llama",
                   "SPEC = dataclasses.replace(_GOOD, data_parallel=None)\n");
  for (const bool adapters_fsdp : {true, false}) {
    for (const std::string dimension : {"dp", "dp_shard"}) {
      const std::string label = std::string(adapters_fsdp ? "the adapter's FSDP2" : "the gate") + " " + dimension;
      SCOPED_TRACE(label);
      const auto ranks = RunWorker(adapters_fsdp ? "gh_archon.llama.spec:SPEC" : "gate_reduces.spec:SPEC",
                                   "llama", "llama-tiny-untied", "fp32", kParallelPhases,
                                   /*world=*/2, dir.path().string(), dimension);
      ASSERT_TRUE(ranks[0].ends.count("parallel"));
      const json& end = ranks[0].ends.at("parallel");
      EXPECT_EQ(end.value("status", ""), "PASS") << end.dump();
      EXPECT_EQ(ranks[1].ends.count("parallel") ? ranks[1].ends.at("parallel").value("status", "") : "", "PASS");
      std::cout << "[parallel figures] python lane llama-tiny-untied " << dimension << "=2 fp32, "
                << (adapters_fsdp ? "reduced by the adapter's FSDP2" : "reduced by the gate");
      for (const char* name : {"loss_step_1", "loss_step_1_rel_diff", "loss_step_2_rel_diff",
                               "grad_norm_step_1", "grad_norm_step_1_rel_diff", "grad_norm_step_2_rel_diff",
                               "grad_max_rel_diff", "grad_order_floor_max_rel", "grads_bit_equal",
                               "grads_compared", "grads_step1_bit_equal_to_grouping",
                               "replica_max_abs_diff", "params_after_max_abs_diff",
                               "save_tensors_bit_equal", "save_tensors", "global_batch_sequences",
                               "optimizer_state_elements_rank0", "optimizer_state_elements_unsharded"}) {
        std::cout << " " << name << "=" << ranks[0].Figure("parallel", name).dump();
      }
      std::cout << std::endl;
      EXPECT_EQ(ranks[0].Figure("parallel", "replica_max_abs_diff"), 0.0);
      EXPECT_LT(ranks[0].Figure("parallel", "loss_step_2_rel_diff").get<double>(), 1e-5);
      EXPECT_LT(ranks[0].Figure("parallel", "grad_norm_step_1_rel_diff").get<double>(), 1e-5);
      EXPECT_EQ(ranks[0].Figure("parallel", "save_tensors_bit_equal"), ranks[0].Figure("parallel", "save_tensors"));
      EXPECT_NE(ranks[0].Figure("parallel", "replicated_by").get<std::string>().find(
                    adapters_fsdp ? "the adapter's data_parallel" : "every rank holds the whole model"),
                std::string::npos)
          << ranks[0].Figure("parallel", "replicated_by");
      const int64_t state = ranks[0].Figure("parallel", "optimizer_state_elements_rank0").get<int64_t>();
      const int64_t unsharded = ranks[0].Figure("parallel", "optimizer_state_elements_unsharded").get<int64_t>();
      if (adapters_fsdp || dimension == "dp_shard") {
        EXPECT_LT(state, unsharded);
      } else {
        EXPECT_EQ(state, unsharded);
      }
      EXPECT_EQ(ranks[0].exit_code, 0);
      EXPECT_EQ(ranks[1].exit_code, 0);
    }
  }
}

/// Data parallelism with the adapter's own tensor parallelism inside each replica (four worker
/// processes): the lane hands the adapter's parallelize the "tp" dimension of a ("dp", "tp")
/// device mesh. llama-tiny-tied dp=2 x tp=2 with a SPEC without data_parallel: the gate
/// reduces each rank's local gradient shards over the data-parallel group; qwen3_moe
/// dp_shard=2 x tp=2 with the reference adapter's FSDP2 over "dp" (2-D DTensors: Shard(0) over
/// dp, the tp plan's placement over tp), the model reducing by itself. Shards are gathered
/// through the model's own placements; the two steps agree with the single-rank control, each
/// rank holds less than half the optimizer state, and the replicas stay bit-equal.
TEST(PythonLane, DataParallelWithTheAdaptersTensorParallelism) {
  const auto fixtures = Fixtures({"llama", "qwen3_moe"});
  test_util::TempDir dir;
  WriteSpecPackage(dir.path(), "gate_reduces", "llama",
                   "SPEC = dataclasses.replace(_GOOD, data_parallel=None)\n");
  for (const auto& [variant, family, layout, entry] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"llama-tiny-tied", "llama", "dp=2,tp=2", "gate_reduces.spec:SPEC"},
           {"qwen3_moe-tiny-untied", "qwen3_moe", "dp_shard=2,tp=2", "gh_archon.qwen3_moe.spec:SPEC"}}) {
    SCOPED_TRACE(variant + " " + layout);
    if (!fixtures.count(variant)) {
      ADD_FAILURE() << "no fixture " << variant << ": run through ctest";
      continue;
    }
    const auto ranks = RunWorker(entry, family, variant, "fp32", kParallelPhases, /*world=*/4,
                                 dir.path().string(), layout);
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(ranks[r].ends.count("parallel")) << "rank " << r;
      EXPECT_EQ(ranks[r].ends.at("parallel").value("status", ""), "PASS")
          << "rank " << r << ": " << ranks[r].ends.at("parallel").dump();
      EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r;
    }
    std::cout << "[parallel figures] python lane " << variant << " " << layout << " fp32";
    for (const char* name : {"loss_step_1_rel_diff", "loss_step_2_rel_diff",
                             "grad_norm_step_1_rel_diff", "grad_norm_step_2_rel_diff",
                             "grad_norm_sharded_step_1_rel_diff", "grad_nearest_bar_rel_diff",
                             "grad_max_rel_diff", "grad_order_floor_max_rel",
                             "grads_step1_bit_equal_to_grouping", "grads_compared",
                             "replica_max_abs_diff", "params_after_max_abs_diff",
                             "save_tensors_bit_equal", "save_tensors",
                             "optimizer_state_elements_rank0", "optimizer_state_elements_unsharded"}) {
      std::cout << " " << name << "=" << ranks[0].Figure("parallel", name).dump();
    }
    std::cout << std::endl;
    const json& end = ranks[0].ends.at("parallel");
    EXPECT_EQ(ranks[0].Figure("parallel", "replica_max_abs_diff"), 0.0) << end.dump();
    EXPECT_LT(ranks[0].Figure("parallel", "loss_step_1_rel_diff").get<double>(), 1e-6);
    EXPECT_LT(ranks[0].Figure("parallel", "grad_norm_step_1_rel_diff").get<double>(), 1e-5);
    EXPECT_GT(ranks[0].Figure("parallel", "save_tensors").get<int64_t>(), 0);
    EXPECT_EQ(ranks[0].Figure("parallel", "save_tensors_bit_equal"), ranks[0].Figure("parallel", "save_tensors"));
    // Each rank steps its tp shards ("unsharded": the whole of its shards) or, under the
    // adapter's FSDP2, its dim-0 shard of them ("unsharded": the whole model's state).
    const int64_t state = ranks[0].Figure("parallel", "optimizer_state_elements_rank0").get<int64_t>();
    const int64_t unsharded = ranks[0].Figure("parallel", "optimizer_state_elements_unsharded").get<int64_t>();
    if (entry.rfind("gh_archon", 0) == 0) {
      EXPECT_LT(2 * state, unsharded);
    } else {
      EXPECT_EQ(state, unsharded);
    }
  }
}

/// A llama plan whose attention output projection leaves its output Partial (the row-parallel
/// all-reduce forgotten).
constexpr const char* kRowParallelLeftPartial =
    "from torch.distributed.tensor import Partial\n"
    "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module\n"
    "def par(model, mesh):\n"
    "    for layer in model.layers.values():\n"
    "        parallelize_module(layer, mesh, {\n"
    "            'attention.wq': ColwiseParallel(), 'attention.wk': ColwiseParallel(),\n"
    "            'attention.wv': ColwiseParallel(),\n"
    "            'attention.wo': RowwiseParallel(output_layouts=Partial()),\n"
    "            'feed_forward.w1': ColwiseParallel(), 'feed_forward.w3': ColwiseParallel(),\n"
    "            'feed_forward.w2': RowwiseParallel()})\n"
    "    return model\n"
    "SPEC = dataclasses.replace(_GOOD, parallelize=par)\n";

/// A Qwen3 attention plan without SequenceParallel on q_norm / k_norm (left plain).
constexpr const char* kPerHeadNormsPlain =
    "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module\n"
    "def par(model, mesh):\n"
    "    for layer in model.layers.values():\n"
    "        parallelize_module(layer, mesh, {\n"
    "            'attention.wq': ColwiseParallel(), 'attention.wk': ColwiseParallel(),\n"
    "            'attention.wv': ColwiseParallel(), 'attention.wo': RowwiseParallel()})\n"
    "    return model\n"
    "SPEC = dataclasses.replace(_GOOD, parallelize=par)\n";

/// Adapters whose tensor parallelism is broken the ways it breaks, each caught by the parallel
/// gate with a reason naming it: the row-parallel outputs left partial (the all-reduce
/// forgotten), Qwen3's per-head q_norm / k_norm left plain (each rank keeps a partial gradient
/// of their replicated weight), a parallelize that raises on one rank only (the others' wait
/// ends at once, and every rank reports the cause), logits left sharded over the vocabulary,
/// one rank's logits differing from rank 0's, a parallelize that shards nothing, and a
/// ModelSpec without parallelize; under dp x tp (four ranks), the per-head norms left plain
/// and the row-parallel outputs left partial; the adapter's own FSDP2 averaging its gradients
/// (FSDP2's default division) or reducing them in bf16. Every worker still exits 0.
TEST(PythonLane, BrokenParallelizeFails) {
  const auto fixtures = Fixtures({"llama", "qwen3_moe"});
  if (!fixtures.count("llama-tiny-untied") || !fixtures.count("qwen3_moe-tiny-untied")) {
    GTEST_SKIP() << "no fixture";
  }
  struct Case {
    const char* name;
    const char* family;  // the reference adapter the package starts from, and its fixture
    const char* spec;    // spec.py of the package, after `_GOOD = <family's SPEC>`
    const char* reason;  // a part of the parallel gate's reason
    const char* layout = "tp";  // the topology (RunWorker's dimension)
    int world = 2;
  };
  const Case cases[] = {
      {"tp_no_all_reduce", "llama",
       kRowParallelLeftPartial,
       "kl_mean_vs_tp1"},
      {"tp_qk_norm_plain", "qwen3_moe",
       kPerHeadNormsPlain,
       "a replicated parameter's gradient differs between ranks"},
      {"tp_raises_on_rank_1", "llama",
       "import torch.distributed as dist\n"
       "def par(model, mesh):\n"
       "    if dist.get_rank() == 1:\n"
       "        raise RuntimeError('parallelize refused on rank 1 only')\n"
       "    return _GOOD.parallelize(model, mesh)\n"
       "SPEC = dataclasses.replace(_GOOD, parallelize=par)\n",
       "rank 1: tp_raises_on_rank_1.spec:SPEC: parallelize: RuntimeError: parallelize refused on rank 1 only"},
      {"tp_logits_vocab_sharded", "llama",
       "from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module\n"
       "def par(model, mesh):\n"
       "    model = _GOOD.parallelize(model, mesh)\n"
       "    parallelize_module(model, mesh, {'output': ColwiseParallel()})\n"
       "    return model\n"
       "SPEC = dataclasses.replace(_GOOD, parallelize=par)\n",
       "rank 0: the sharded model's forward returned logits [1, 7, 128], not the full [1, 7, 256]"},
      {"tp_rank_1_logits_differ", "llama",
       "import torch, torch.distributed as dist\n"
       "def par(model, mesh):\n"
       "    model = _GOOD.parallelize(model, mesh)\n"
       "    if dist.get_rank() == 1:\n"
       "        forward = model.forward\n"
       "        def flipped(*args, **kwargs):\n"
       "            out = forward(*args, **kwargs)\n"
       "            return out if torch.is_grad_enabled() else out.flip(-1)\n"
       "        model.forward = flipped\n"
       "    return model\n"
       "SPEC = dataclasses.replace(_GOOD, parallelize=par)\n",
       "ranks disagree on the logits"},
      {"tp_shards_nothing", "llama",
       "SPEC = dataclasses.replace(_GOOD, parallelize=lambda model, mesh: model)\n",
       "parallelize sharded no parameter"},
      {"tp_none", "llama", "SPEC = dataclasses.replace(_GOOD, parallelize=None)\n",
       "gives no parallelize"},
      // Under dp x tp: the per-head norms left plain (each tp rank keeps its partial gradient;
      // the data-parallel sum cannot mend it), and row-parallel outputs left partial.
      {"dp_tp_qk_norm_plain", "qwen3_moe",
       kPerHeadNormsPlain,
       "k_norm.weight (checkpoint model.layers.1.self_attn.k_norm.weight) differs from the control's",
       "dp_shard=2,tp=2", 4},
      {"dp_tp_no_all_reduce", "llama",
       kRowParallelLeftPartial,
       "step 1 loss", "dp=2,tp=2", 4},
      // The adapter's own FSDP2: left with its default gradient division (the gradients
      // averaged over the ranks while the loss is already divided by the global token count),
      // and reducing in bf16 where fp32 was asked.
      {"fsdp_gradients_averaged", "llama",
       "from torch.distributed.fsdp import fully_shard\n"
       "def dp(model, mesh):\n"
       "    for layer in model.layers.values():\n"
       "        fully_shard(layer, mesh=mesh)\n"
       "    return fully_shard(model, mesh=mesh)\n"
       "SPEC = dataclasses.replace(_GOOD, data_parallel=dp)\n",
       "gradients were averaged over the 2 data-parallel ranks", "dp"},
      {"fsdp_reduce_bf16", "llama",
       "import torch\n"
       "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n"
       "def dp(model, mesh):\n"
       "    policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)\n"
       "    for m in [*model.layers.values(), model]:\n"
       "        fully_shard(m, mesh=mesh, mp_policy=policy)\n"
       "        m.set_gradient_divide_factor(1.0)\n"
       "        m.set_force_sum_reduction_for_comms(True)\n"
       "    return model\n"
       "SPEC = dataclasses.replace(_GOOD, data_parallel=dp)\n",
       "step 1 gradient", "dp_shard"},
  };
  for (const Case& c : cases) {
    test_util::TempDir dir;
    WriteSpecPackage(dir.path(), c.name, c.family, c.spec);
    const auto ranks = RunWorker(std::string(c.name) + ".spec:SPEC", c.family,
                                 std::string(c.family) + "-tiny-untied", "fp32", kParallelPhases,
                                 c.world, dir.path().string(), c.layout);
    ASSERT_TRUE(ranks[0].ends.count("parallel")) << c.name;
    const json& end = ranks[0].ends.at("parallel");
    std::cout << "[parallel mutation] python lane " << c.name << " (" << c.layout
              << "): " << end.value("reason", "") << std::endl;
    EXPECT_EQ(end.value("status", ""), "FAIL") << c.name << ": " << end.dump();
    EXPECT_EQ(end.value("classification", ""), "adapter_contract") << c.name << ": " << end.dump();
    EXPECT_NE(end.value("reason", "").find(c.reason), std::string::npos) << c.name << ": " << end.dump();
    EXPECT_EQ(ranks[0].exit_code, 0) << c.name;
    EXPECT_EQ(ranks[1].exit_code, 0) << c.name;
  }
}

}  // namespace
}  // namespace gatehouse::worker
