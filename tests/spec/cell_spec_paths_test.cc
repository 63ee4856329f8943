// One spec, three readers: the same submit bodies go through the controller (freeze, the
// scheduler's demand), the agent (the assignment's spec, the run.json it writes, the GPUs it
// hands the ranks) and the worker (the run spec it parses), and every reader gets the same
// cell spec. A field added to one reader and not the others fails here.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "agent/worker_launcher.h"
#include "common/cell_spec.h"
#include "common/sha256.h"
#include "controller/cell_identity.h"
#include "controller/scheduler.h"
#include "gatehouse/worker/run_spec.h"
#include "tests/common/temp_dir.h"

namespace gatehouse {
namespace {

using nlohmann::json;

constexpr char kCommit[] = "0123456789abcdef0123456789abcdef01234567";

// Every branch and commit resolves to kCommit.
class FixedResolver : public controller::CommitResolver {
 public:
  Result<std::string> ResolveBranch(const std::string&, const std::string&) override {
    return std::string(kCommit);
  }
  Result<std::string> ResolveCommit(const std::string&, const std::string&) override {
    return std::string(kCommit);
  }
  Result<std::optional<std::string>> ReadFileAt(const std::string&, const std::string&,
                                                const std::string&) override {
    return std::optional<std::string>();  // no recipe: nothing checked at submit
  }
};

void Write(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

TEST(CellSpecPathsTest, ControllerAgentAndWorkerReadTheSameSpec) {
  test_util::TempDir tmp("cell-spec-paths");
  const auto checkpoint = tmp.path() / "llama-tiny" / "checkpoint";
  const auto reference = tmp.path() / "llama-tiny" / "reference";
  Write(checkpoint / "config.json", R"({"model_type": "llama"})");
  Write(reference / "reference.json", "{}");
  Write(reference / "reference.safetensors", "not read here");

  const json base = {{"repository", "/repos/adapter"},
                     {"branch", "main"},
                     {"model_family", "llama"},
                     {"checkpoint", checkpoint.string()}};
  std::vector<json> bodies = {base};
  json full = base;
  full.update(json{{"commit", std::string(kCommit)},
                   {"reference", reference.string() + "/"},
                   {"precision", "bf16"},
                   {"mode", "cuda_graph"},
                   {"device", "cuda"},
                   {"topology", {{"tp", 2}, {"dp", 2}, {"ep", 2}}},
                   {"training", {{"steps", 4}, {"lr", 3e-4}, {"seed", 7}}},
                   {"decode", {{"max_new_tokens", 64}}},
                   {"env", {{"NCCL_DEBUG", "INFO"}, {"EMPTY", ""}}},
                   {"phases", {"decode", "identity", "load", "config", "construct"}},
                   {"runtime", {{"torch", "2.11.0"}, {"cuda", "13.0"}, {"gpu_model", "h200"}}},
                   {"priority", 5}});
  bodies.push_back(full);
  json cpu_group = base;
  cpu_group["topology"] = {{"pp", 4}};
  cpu_group["runtime"] = {{"torch", "2.12.0+cpu"}};
  bodies.push_back(cpu_group);
  // A reference cell (upstream on the checkpoint) with both kinds of prompt.
  bodies.push_back({{"kind", "reference"},
                    {"checkpoint", checkpoint.string()},
                    {"decode", {{"max_new_tokens", 8}}},
                    {"prompts", {{{"ids", {3, 4, 5}}}, {{"text", "Hi"}, {"chat", true}}}}});
  Write(checkpoint / "tokenizer.json", "{}");  // a text prompt needs one
  controller::DigestCache digests;
  FixedResolver resolver;
  SubmitContext context;
  controller::CellFreezer freezer(context, resolver, digests);
  const std::vector<int> gpu_indices = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<std::string> gpu_models = {
      "NVIDIA A100-SXM4-80GB", "NVIDIA H200", "NVIDIA H200", "NVIDIA A100-SXM4-80GB",
      "NVIDIA H200",           "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"};

  for (const json& body : bodies) {
    SCOPED_TRACE(body.dump());
    // Controller: the body as read, and the cell it freezes.
    const SubmitRequest request = ParseSubmitBody(body.dump(), context).value();
    const controller::FrozenCell cell = freezer.FreezeAndWait(body.dump()).value();
    CellSpec expected = request.spec;
    expected.checkpoint.digest = digests.Digest(checkpoint).value();
    if (!expected.IsReference()) expected.commit = kCommit;
    if (request.auto_reference) {
      // No reference named: the reference cell of this checkpoint, frozen beside it.
      ASSERT_NE(cell.reference_cell, nullptr);
      expected.reference.cell = cell.reference_cell->id;
      EXPECT_EQ(cell.reference_cell->spec,
                ParseCellSpecJson(cell.reference_cell->spec_json).value());
    } else if (!expected.IsReference()) {
      expected.reference.digest = digests.Digest(reference).value();
    }
    EXPECT_EQ(cell.spec_json, CanonicalSpecJson(expected));
    EXPECT_EQ(cell.id, Sha256Hex(cell.spec_json));
    EXPECT_EQ(cell.priority, request.priority);

    // Scheduler: the demand of the stored spec.
    const controller::Demand demand = controller::DemandOfSpec(cell.spec_json);
    EXPECT_EQ(demand.invalid, "");

    // Agent: the assignment's spec, and the run.json it writes for the worker.
    const CellSpec agent_spec = ParseCellSpecJson(cell.spec_json).value();
    EXPECT_EQ(agent_spec, expected);
    agent::WorkerLaunch launch;
    launch.attempt_id = 3;
    launch.attempt_dir = tmp.path() / "attempts" / "3";
    launch.spec = agent_spec;
    launch.checkout.head = kCommit;
    launch.checkout.path = tmp.path() / "checkout";
    const json run = agent::MakeRunSpec(launch);

    // Worker: the run spec.
    const worker::RunSpec worker_spec = worker::ParseRunSpec(run).value();
    EXPECT_EQ(static_cast<const CellSpec&>(worker_spec), expected);
    EXPECT_EQ(CanonicalSpecJson(worker_spec), cell.spec_json);
    EXPECT_EQ(worker_spec.attempt.id, 3);

    // What the scheduler counted is what the agent launches and the worker runs.
    EXPECT_EQ(demand.world_size, worker_spec.topology.world_size());
    EXPECT_EQ(demand.gpu, worker_spec.runtime.device == "cuda");
    EXPECT_EQ(demand.torch, worker_spec.runtime.torch);
    EXPECT_EQ(demand.cuda, worker_spec.runtime.cuda);
    EXPECT_EQ(demand.gpu_model, worker_spec.runtime.gpu_model);
    EXPECT_EQ(demand.transformers, worker_spec.runtime.transformers);
    const auto visible = agent::VisibleDevices(agent_spec, gpu_indices, gpu_models).value();
    ASSERT_TRUE(visible.has_value());
    if (demand.gpu) {
      std::vector<int> chosen;
      for (size_t at = 0; at < visible->size();) {
        const size_t comma = visible->find(',', at);
        chosen.push_back(std::stoi(visible->substr(at, comma - at)));
        at = comma == std::string::npos ? visible->size() : comma + 1;
      }
      EXPECT_EQ(static_cast<int>(chosen.size()), demand.world_size);
      for (int g : chosen) {
        EXPECT_TRUE(GpuModelMatches(gpu_models[static_cast<size_t>(g)], demand.gpu_model)) << g;
      }
    } else {
      EXPECT_EQ(*visible, "");
    }
  }
}

}  // namespace
}  // namespace gatehouse
