// Test helper for the parallel gate's checks: one thread per rank over a real gloo group on
// 127.0.0.1 (tests/worker/gloo_ranks.h), each rank running the earlier gates (config ..
// load) on a transformers-saved fixture and then the check under test. Used by
// parallel_test.cc (tensor parallelism) and parallel_dp_test.cc (data parallelism), with the
// base of their families that change one behaviour of a registered one (DelegatingFamily).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/cell_spec.h"
#include "tests/common/temp_dir.h"
#include "tests/models/family_test_util.h"
#include "tests/worker/gloo_ranks.h"

namespace gatehouse::test_util {

/// A family that delegates to a real one: the base of the test families that change one
/// behaviour (a fault, a lane's property) of a registered family.
class DelegatingFamily : public worker::ModelFamily {
 public:
  explicit DelegatingFamily(const worker::ModelFamily& real) : real_(real) {}
  std::string_view name() const override { return real_.name(); }
  std::vector<std::string> model_types() const override { return real_.model_types(); }
  Result<worker::ParsedConfig> ParseConfig(const nlohmann::json& c) const override { return real_.ParseConfig(c); }
  Result<std::shared_ptr<worker::CausalLM>> Construct(const worker::ModelArgs& a, torch::Dtype d,
                                                      torch::Device dev) const override {
    return real_.Construct(a, d, dev);
  }
  Result<worker::StateDictAdapter> Adapter(const worker::ModelArgs& a) const override { return real_.Adapter(a); }

 protected:
  const worker::ModelFamily& real_;
};

/// What every rank's parallel check (and its earlier gates) reported.
struct RankOutcomes {
  std::vector<std::string> errors;            // per rank: join error or exception
  std::vector<worker::GateOutcome> outcomes;  // per rank: the check under test
  std::vector<std::string> early;             // per rank: an earlier gate that did not PASS
};

/// "dp=2 x dp_shard=2 x cp=2 x tp=2 x ep=2": the enabled dimensions of a topology, for traces
/// and figure lines.
inline std::string MeshLabel(const CellSpec::Topology& t) {
  std::string text;
  for (const auto& [name, size] : {std::pair<const char*, int64_t>{"dp", t.dp},
                                   {"dp_shard", t.dp_shard}, {"cp", t.cp}, {"tp", t.tp},
                                   {"ep", t.ep}}) {
    if (size > 1) text += (text.empty() ? "" : " x ") + std::string(name) + "=" + std::to_string(size);
  }
  return text;
}

/// Success when every rank joined its group, passed the gates before the check and PASSed
/// the check; else the first rank that did not, and why. Use as
/// ASSERT_TRUE(EveryRankPassed(run)).
inline ::testing::AssertionResult EveryRankPassed(const RankOutcomes& run) {
  for (size_t r = 0; r < run.outcomes.size(); ++r) {
    if (!run.errors[r].empty()) return ::testing::AssertionFailure() << "rank " << r << ": " << run.errors[r];
    if (!run.early[r].empty()) return ::testing::AssertionFailure() << "rank " << r << ": " << run.early[r];
    if (run.outcomes[r].status != GateStatus::kPass) {
      return ::testing::AssertionFailure() << "rank " << r << ": " << run.outcomes[r].reason;
    }
  }
  return ::testing::AssertionSuccess();
}

/// Runs config, construct, load and then `check` (the parallel gate by default) on
/// topology.world_size() in-process ranks for a fixture, the cell's topology set to `topology`.
/// `family_override` replaces the registry's family after the config gate (to inject faults).
inline RankOutcomes RunParallelRanks(
    const std::string& variant, const std::string& family, const CellSpec::Topology& topology,
    const std::string& precision, const worker::ModelFamily* family_override = nullptr,
    const std::function<worker::GateOutcome(worker::GateContext&)>& check = worker::ParallelGate) {
  torch::set_num_threads(1);
  TempDir attempt("gatehouse-parallel");
  const int world = static_cast<int>(topology.world_size());
  RankOutcomes run;
  run.outcomes.resize(static_cast<size_t>(world));
  run.early.resize(static_cast<size_t>(world));
  run.errors = RunGlooGroups(world, [&](int r, std::shared_ptr<worker::TpCommunicator> comm,
                                        std::shared_ptr<worker::SubgroupFactory> subgroups) {
    worker::GateContext ctx = FixtureContext(FixtureDir(variant), family, precision, attempt.path());
    ctx.spec.topology = topology;
    ctx.rank = r;
    ctx.world_size = world;
    ctx.comm = comm;
    ctx.subgroups = subgroups;
    ctx.comm_backend = "gloo";
    for (const auto& g : GatesThrough("load")) {
      worker::GateOutcome out = g.run(ctx);
      if (out.status != GateStatus::kPass) {
        run.early[static_cast<size_t>(r)] = std::string(g.phase) + ": " + out.reason;
        break;
      }
      if (family_override != nullptr && std::string(g.phase) == "config") ctx.family = family_override;
    }
    run.outcomes[static_cast<size_t>(r)] = check(ctx);
  });
  return run;
}

/// The real figure `name` of `out`, or -1 (and a test failure) when it lacks one.
inline double RealFigure(const worker::GateOutcome& out, const std::string& name) {
  const worker::Figure* f = out.Find(name);
  EXPECT_NE(f, nullptr) << name;
  return f != nullptr && std::holds_alternative<double>(f->value) ? std::get<double>(f->value) : -1.0;
}

/// The count figure `name` of `out`, or -1 (and a test failure) when it lacks one.
inline int64_t CountFigure(const worker::GateOutcome& out, const std::string& name) {
  const worker::Figure* f = out.Find(name);
  EXPECT_NE(f, nullptr) << name;
  return f != nullptr && std::holds_alternative<int64_t>(f->value) ? std::get<int64_t>(f->value) : -1;
}

/// Prints one line, "[parallel figures] <label> name=value ...", with the named figures of
/// `out` ("-" for one it lacks; reals to 3 significant digits): what docs/parity.md's table of
/// parallel layouts is read from.
inline void PrintFigures(const std::string& label, const worker::GateOutcome& out,
                         const std::vector<std::string>& names) {
  std::ostringstream line;
  line << "[parallel figures] " << label;
  for (const std::string& name : names) {
    line << " " << name << "=";
    const worker::Figure* f = out.Find(name);
    if (f == nullptr) {
      line << "-";
    } else {
      std::visit([&](const auto& v) { line << std::setprecision(3) << v; }, f->value);
    }
  }
  std::cout << line.str() << std::endl;
}

}  // namespace gatehouse::test_util
