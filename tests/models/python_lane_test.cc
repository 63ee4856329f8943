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
#include "tests/models/python_lane_util.h"
#include "worker_lib/python_lane/python_lane.h"

namespace gatehouse::worker {
namespace {

using namespace lane_test;  // NOLINT(google-build-using-namespace)

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

}  // namespace
}  // namespace gatehouse::worker
