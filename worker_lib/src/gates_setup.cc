// The gates before any weight is loaded: identity (the runtime and the inputs are the ones the
// cell froze), config (every config.json field accounted for) and construct (the model builds).
#include "gatehouse/worker/gates.h"

#include <caffe2/core/common.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "common/sha256.h"
#include "gatehouse/worker/cuda_graph.h"
#include "gatehouse/worker/distributed.h"
#include "gates_internal.h"

namespace gatehouse::worker {

using internal::JoinFew;
using internal::Num;
using internal::ShapeString;

// --- runtime -------------------------------------------------------------------------------

std::string StripLocalVersion(std::string_view version) {
  return std::string(version.substr(0, version.find('+')));
}

RuntimeInfo ProbeRuntime() {
  RuntimeInfo info;
  info.torch_headers_version = TORCH_VERSION;
  const auto& options = caffe2::GetBuildOptions();
  auto it = options.find("TORCH_VERSION");
  info.torch_version = StripLocalVersion(it != options.end() ? it->second : TORCH_VERSION);
  info.cuda_available = torch::cuda::is_available();
  info.cuda_device_count = static_cast<int64_t>(torch::cuda::device_count());
  const CudaVersions cuda = ProbeCudaVersions();
  info.cuda_version = cuda.cuda;
  info.cudnn_version = cuda.cudnn;
  info.nccl_version = cuda.nccl;
  info.cuda_driver_version = cuda.driver;
  return info;
}

nlohmann::json RuntimeJson(const RuntimeInfo& r) {
  return {{"torch", r.torch_version},
          {"torch_headers", r.torch_headers_version},
          {"cuda", r.cuda_version},
          {"cudnn", r.cudnn_version},
          {"nccl", r.nccl_version},
          {"cuda_driver", r.cuda_driver_version},
          {"cuda_available", r.cuda_available},
          {"cuda_device_count", r.cuda_device_count},
          {"nccl_groups", NcclGroupsAvailable()}};
}

// --- identity ------------------------------------------------------------------------------

namespace {

// The agent's build figures (GATEHOUSE_BUILD, protocols.md §5.1): "duration_ms=22400
// compilations=211 cache_hits=211", the last two for a C++ adapter only (a Python adapter's
// pip build goes through no ccache). Unset or empty (no agent build, a reference cell): none.
void RecordBuildFigures(GateOutcome& out, const char* build) {
  if (build == nullptr) return;
  std::istringstream words{std::string(build)};
  for (std::string word; words >> word;) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = word.substr(0, eq);
    int64_t value = 0;
    const char* first = word.data() + eq + 1;
    const char* last = word.data() + word.size();
    const auto [end, error] = std::from_chars(first, last, value);
    if (error != std::errc() || end != last || first == last) continue;
    if (key == "duration_ms") {
      out.Real("build_duration_ms", static_cast<double>(value), "ms");
    } else if (key == "compilations") {
      out.Count("build_compilations", value);
    } else if (key == "cache_hits") {
      out.Count("build_cache_hits", value);
    }
  }
}

}  // namespace

GateOutcome IdentityGate(GateContext& ctx) {
  GateOutcome out;
  const auto& spec = ctx.spec;
  const auto& checkout = spec.attempt.checkout;
  out.Text("sha", checkout.head);
  out.Text("commit", spec.commit);
  out.Text("tree_clean", checkout.clean ? "true" : "false");
  out.Text("torch_version", ctx.runtime.torch_version);
  out.Text("torch_headers_version", ctx.runtime.torch_headers_version);
  out.Text("torch_pin", spec.runtime.torch);
  out.Text("device", spec.runtime.device);
  out.Text("cuda_available", ctx.runtime.cuda_available ? "true" : "false");
  out.Count("cuda_device_count", ctx.runtime.cuda_device_count);
  out.Text("cuda_version", ctx.runtime.cuda_version);
  out.Text("cuda_pin", spec.runtime.cuda);
  out.Text("cudnn_version", ctx.runtime.cudnn_version);
  out.Text("nccl_version", ctx.runtime.nccl_version);
  out.Text("cuda_driver_version", ctx.runtime.cuda_driver_version);
  // Where the submitter's code ran: the agent's sandbox (GATEHOUSE_SANDBOX, protocols.md §3.6).
  const char* sandbox = std::getenv("GATEHOUSE_SANDBOX");
  out.Text("sandbox", sandbox != nullptr && *sandbox != '\0' ? sandbox : "none");
  // And in which cgroup, with what memory and process limits (GATEHOUSE_CGROUP, §3.7).
  const char* cgroup = std::getenv("GATEHOUSE_CGROUP");
  out.Text("cgroup", cgroup != nullptr && *cgroup != '\0' ? cgroup : "none");

  // `gatehouse run` (GATEHOUSE_LOCAL_RUN, protocols.md §3.9): the owner's working tree, which
  // may have changes; the evidence says so and is nobody's frozen verdict.
  const char* local = std::getenv("GATEHOUSE_LOCAL_RUN");
  const bool local_run = local != nullptr && *local != '\0';
  out.Text("evidence", local_run ? std::string(local) : "frozen");
  RecordBuildFigures(out, std::getenv("GATEHOUSE_BUILD"));

  // A wrong or dirty checkout: the evidence could not be attributed to the frozen commit.
  std::vector<std::string> fails;
  if (checkout.head != spec.commit) {
    fails.push_back("checked out " + (checkout.head.empty() ? "(nothing)" : checkout.head) +
                    " but the cell is frozen at " + spec.commit);
  }
  if (!checkout.clean && !local_run) {
    fails.push_back("checkout " + checkout.path + " has local changes (tree not clean)");
  }
  if (!fails.empty()) return out.Fail(FailureClass::kUnknown, JoinFew(fails));

  // The environment does not match the pin: BLOCKED, never silently accepted.
  std::vector<std::string> blocks;
  if (spec.runtime.torch != ctx.runtime.torch_version) {
    blocks.push_back("runtime pin torch " + spec.runtime.torch + " but the worker runs torch " +
                     ctx.runtime.torch_version);
  }
  if (StripLocalVersion(ctx.runtime.torch_headers_version) != ctx.runtime.torch_version) {
    blocks.push_back("worker built against torch " + ctx.runtime.torch_headers_version +
                     " headers but runs library " + ctx.runtime.torch_version);
  }
  if (!spec.runtime.cuda.empty() && spec.runtime.cuda != ctx.runtime.cuda_version) {
    blocks.push_back("runtime pin cuda " + spec.runtime.cuda + " but the worker's LibTorch is built with CUDA " +
                     (ctx.runtime.cuda_version.empty() ? "(none)" : ctx.runtime.cuda_version));
  }
  if (spec.runtime.device == "cuda" && !ctx.runtime.cuda_available) {
    blocks.push_back("device cuda requested but torch::cuda::is_available() is false");
  }
  // The inputs on this node must be the frozen ones: a checkpoint or reference changed (or
  // missing) since the cell was frozen would make the evidence belong to other inputs.
  // A reference cell's bundle (reference.cell) was fetched by the agent, digest-checked, to
  // reference.path; its digest is that directory's.
  // The checkpoint's bytes are counted for NaN/Inf as they are hashed (safetensors_scan.h):
  // the load gate takes an adopted weight's count from here instead of reading it again.
  auto scan = std::make_shared<safetensors::FiniteScan>();
  ctx.checkpoint_scan.reset();
  for (const auto& [name, input, observer] :
       {std::tuple<const char*, const DigestedPath*, DigestObserver*>{"checkpoint",
                                                                      &spec.checkpoint, scan.get()},
        std::tuple<const char*, const DigestedPath*, DigestObserver*>{"reference",
                                                                      &spec.reference, nullptr}}) {
    Result<std::string> digest = DirectoryDigest(input->path, observer);
    if (!digest.ok()) {
      blocks.push_back(std::string(name) + " " + input->path + ": " + digest.status().message());
      continue;
    }
    out.Text(std::string(name) + "_digest", *digest);
    if (*digest != input->digest) {
      blocks.push_back(std::string(name) + " " + input->path + " has digest " + *digest +
                       " on this node but the cell is frozen with " + input->digest);
    } else if (observer != nullptr) {
      ctx.checkpoint_scan = scan;  // counts of the frozen bytes only
      out.Bytes("checkpoint_bytes_scanned_finite", static_cast<int64_t>(scan->bytes_counted()));
    }
  }
  if (!blocks.empty()) return out.Blocked(JoinFew(blocks));
  return out;
}

// --- config --------------------------------------------------------------------------------

namespace {

/// num_attention_heads for the TP check: config.json's HF field, else the args JSON.
std::optional<int64_t> AttentionHeads(const nlohmann::json& config, const nlohmann::json& args) {
  for (const auto* j : {&config, &args}) {
    for (const char* key : {"num_attention_heads", "n_heads"}) {
      auto it = j->find(key);
      if (it != j->end() && it->is_number_integer()) return it->get<int64_t>();
    }
  }
  return std::nullopt;
}

}  // namespace

GateOutcome ConfigGate(GateContext& ctx) {
  GateOutcome out;
  if (!ctx.plugin_errors.empty()) {
    return out.Fail(FailureClass::kAdapterContract, JoinFew(ctx.plugin_errors));
  }
  // config.json alone: the tensor files are the load gate's, so a missing shard or a corrupt
  // file is reported there, naming the file and tensor. An unreadable config.json is a fault
  // of the input, not of the adapter: BLOCKED (docs/protocols.md §4).
  Result<nlohmann::json> read = Checkpoint::ReadConfig(ctx.spec.checkpoint.path);
  if (!read.ok()) {
    return out.Blocked("checkpoint " + ctx.spec.checkpoint.path + ": " + read.status().ToString());
  }
  const nlohmann::json config = std::move(read).value();

  const ModelFamily* family =
      ctx.registry ? ctx.registry->FindByName(ctx.spec.model_family) : nullptr;
  if (family == nullptr) {
    std::vector<std::string> names = ctx.registry ? ctx.registry->Names() : std::vector<std::string>{};
    return out.Fail(FailureClass::kAdapterContract,
                    "model family '" + ctx.spec.model_family + "' is not registered; registered: " +
                        (names.empty() ? std::string("(none)") : JoinFew(names, 20)));
  }
  ctx.family = family;

  auto mt = config.find("model_type");
  const std::vector<std::string> types = family->model_types();
  if (mt == config.end() || !mt->is_string()) {
    return out.Fail(FailureClass::kAdapterContract,
                    "config.json has no string model_type; family '" +
                        std::string(family->name()) + "' serves " + JoinFew(types, 20));
  }
  const std::string model_type = mt->get<std::string>();
  out.Text("model_type", model_type);
  if (std::find(types.begin(), types.end(), model_type) == types.end()) {
    return out.Fail(FailureClass::kAdapterContract,
                    "config.json model_type '" + model_type + "' is not served by family '" +
                        std::string(family->name()) + "', which serves " + JoinFew(types, 20));
  }

  Result<ParsedConfig> parsed = family->ParseConfig(config);
  if (!parsed.ok()) {
    return out.Fail(FailureClass::kAdapterContract,
                    "ParseConfig: " + parsed.status().ToString());
  }
  if (!parsed->args) {
    return out.Fail(FailureClass::kAdapterContract, "ParseConfig returned no args");
  }

  // Every top-level field must be accounted for: mapped or ignored (with a reason).
  const ConfigReport& report = parsed->report;
  std::set<std::string> mapped(report.mapped.begin(), report.mapped.end());
  std::set<std::string> ignored;
  for (const auto& [field, why] : report.ignored) ignored.insert(field);
  std::set<std::string> unmapped(report.unmapped.begin(), report.unmapped.end());
  int64_t n_mapped = 0, n_ignored = 0;
  std::vector<std::string> ignored_list;
  for (auto it = config.begin(); it != config.end(); ++it) {
    if (mapped.count(it.key())) ++n_mapped;
    else if (ignored.count(it.key())) ++n_ignored;
    else unmapped.insert(it.key());  // listed as unmapped, or not reported at all
  }
  for (const auto& [field, why] : report.ignored) {
    if (config.contains(field)) ignored_list.push_back(field + " (" + why + ")");
  }
  std::vector<std::string> unmapped_list(unmapped.begin(), unmapped.end());
  out.Count("fields_total", static_cast<int64_t>(config.size()));
  out.Count("fields_mapped", n_mapped);
  out.Count("fields_ignored", n_ignored);
  out.Count("fields_unmapped", static_cast<int64_t>(unmapped_list.size()));
  if (!ignored_list.empty()) out.Text("ignored_fields", JoinFew(ignored_list, 100));
  const nlohmann::json args_json = parsed->args->ToJson();
  out.Text("args", args_json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  ctx.args = parsed->args;

  if (!unmapped_list.empty()) {
    return out.Fail(FailureClass::kAdapterContract,
                    std::to_string(unmapped_list.size()) +
                        " config.json field(s) neither mapped nor ignored: " +
                        JoinFew(unmapped_list, 20));
  }

  // TP divisibility (docs/gate-facts.md "Tensor parallelism"): checked at config time.
  const int64_t tp = ctx.spec.topology.tp;
  const int64_t kv_heads = parsed->args->num_key_value_heads();
  const std::optional<int64_t> heads = AttentionHeads(config, args_json);
  if (heads) out.Count("num_attention_heads", *heads);
  out.Count("num_key_value_heads", kv_heads);
  std::vector<std::string> tp_problems;
  if (!heads && tp > 1) {
    return out.Unknown("tp=" + std::to_string(tp) +
                       ": num_attention_heads is in neither config.json nor the args");
  }
  if (heads && *heads % tp != 0) {
    tp_problems.push_back("num_attention_heads=" + std::to_string(*heads));
  }
  if (kv_heads % tp != 0) tp_problems.push_back("num_key_value_heads=" + std::to_string(kv_heads));
  if (!tp_problems.empty()) {
    // The layout does not fit this checkpoint (no adapter can change that): BLOCKED, not a
    // verdict on the adapter.
    return out.Blocked("tensor-parallel size tp=" + std::to_string(tp) + " does not divide " +
                       JoinFew(tp_problems) + ": choose a tp that divides the head counts");
  }
  return out;
}

// --- construct -----------------------------------------------------------------------------

GateOutcome ConstructGate(GateContext& ctx) {
  GateOutcome out;
  if (!ctx.family || !ctx.args) {
    return out.Unknown(ctx.spec.Requested("config") ? "no model args: phase config did not pass"
                                                    : "no model args: phase config was not requested");
  }
  ctx.dtype = ctx.spec.precision == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  ctx.device = ctx.spec.runtime.device == "cuda"
                   ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(ctx.device_index))
                   : torch::Device(torch::kCPU);
  // When the load phase follows, it overwrites every parameter (or FAILs naming the ones no
  // key reaches, and the phases that compute are skipped): no fresh-weight init is drawn.
  const bool load_follows = ctx.spec.Requested("load");
  std::optional<SkipWeightInit> skip_init;
  if (load_follows) skip_init.emplace();
  Result<std::shared_ptr<CausalLM>> built = ctx.family->Construct(*ctx.args, ctx.dtype, ctx.device);
  skip_init.reset();
  out.Text("weight_init", load_follows ? "skipped: phase load overwrites every parameter"
                                       : "fresh (phase load not requested)");
  if (!built.ok()) {
    return out.Fail(FailureClass::kAdapterContract, "Construct: " + built.status().ToString());
  }
  if (!*built) return out.Fail(FailureClass::kAdapterContract, "Construct returned no model");
  ctx.model = *built;
  ctx.model_loaded = false;

  int64_t count = 0, bytes = 0;
  std::vector<std::string> wrong;
  const auto groups = UniqueParameters(*ctx.model);
  for (const auto& g : groups) {
    count += g.tensor.numel();
    bytes += g.tensor.numel() * static_cast<int64_t>(g.tensor.element_size());
    if (g.tensor.scalar_type() != ctx.dtype || g.tensor.device().type() != ctx.device.type()) {
      wrong.push_back(g.names[0] + " is " + std::string(c10::toString(g.tensor.scalar_type())) +
                      " on " + g.tensor.device().str());
    }
  }
  out.Count("param_count", count);
  out.Bytes("param_bytes", static_cast<int64_t>(bytes));
  out.Count("param_tensors", static_cast<int64_t>(groups.size()));
  out.Text("dtype", std::string(c10::toString(ctx.dtype)));
  out.Text("device", ctx.device.str());
  if (groups.empty()) return out.Fail(FailureClass::kAdapterContract, "the model has no parameter");
  if (!wrong.empty()) {
    return out.Fail(FailureClass::kAdapterContract,
                    "parameters not in the requested " + std::string(c10::toString(ctx.dtype)) +
                        " on " + ctx.device.str() + ": " + JoinFew(wrong));
  }
  return out;
}

}  // namespace gatehouse::worker
