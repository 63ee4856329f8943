// The runner and the structural gates: identity, config, construct, load, save, parallel,
// cuda_graph (docs/architecture.md "Phases, statuses and blame"). The numerical gates are in
// gates_compute.cc.
#include "gatehouse/worker/gates.h"

#include <caffe2/core/common.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "common/sha256.h"
#include "gatehouse/worker/cuda_graph.h"
#include "gatehouse/worker/distributed.h"
#include "gatehouse/worker/log.h"
#include "gatehouse/worker/safetensors_torch.h"
#include "gates_internal.h"

namespace gatehouse::worker {

using internal::JoinFew;
using internal::Num;
using internal::ShapeString;

// --- GateOutcome ---------------------------------------------------------------------------

GateOutcome& GateOutcome::Set(GateStatus s, std::string why, FailureClass c) {
  status = s;
  reason = std::move(why);
  classification = c;
  return *this;
}

const Figure* GateOutcome::Find(std::string_view name) const {
  for (const auto& f : figures) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

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

std::vector<ParamGroup> UniqueParameters(const torch::nn::Module& module) {
  std::vector<ParamGroup> groups;
  std::unordered_map<const c10::TensorImpl*, size_t> index;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
    auto [it, inserted] = index.emplace(impl, groups.size());
    if (inserted) groups.push_back({{item.key()}, item.value()});
    else groups[it->second].names.push_back(item.key());
  }
  return groups;
}

// --- identity ------------------------------------------------------------------------------

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

  // A wrong or dirty checkout: the evidence could not be attributed to the frozen commit.
  std::vector<std::string> fails;
  if (checkout.head != spec.commit) {
    fails.push_back("checked out " + (checkout.head.empty() ? "(nothing)" : checkout.head) +
                    " but the cell is frozen at " + spec.commit);
  }
  if (!checkout.clean) {
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
  for (const auto& [name, input] : {std::pair{"checkpoint", &spec.checkpoint},
                                    std::pair{"reference", &spec.reference}}) {
    Result<std::string> digest = DirectoryDigest(input->path);
    if (!digest.ok()) {
      blocks.push_back(std::string(name) + " " + input->path + ": " + digest.status().message());
      continue;
    }
    out.Text(std::string(name) + "_digest", *digest);
    if (*digest != input->digest) {
      blocks.push_back(std::string(name) + " " + input->path + " has digest " + *digest +
                       " on this node but the cell is frozen with " + input->digest);
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
    return out.Fail(FailureClass::kAdapterContract,
                    "tensor-parallel size tp=" + std::to_string(tp) + " does not divide " +
                        JoinFew(tp_problems));
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
  Result<std::shared_ptr<CausalLM>> built = ctx.family->Construct(*ctx.args, ctx.dtype, ctx.device);
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

// --- load ----------------------------------------------------------------------------------

Result<LoadReport> LoadStateDict(const Checkpoint& checkpoint, const StateDictAdapter& adapter,
                                 CausalLM& model, const ShardedLoad* shard) {
  LoadReport rep;
  const auto groups = UniqueParameters(model);
  std::unordered_map<std::string, size_t> group_of;
  for (size_t i = 0; i < groups.size(); ++i) {
    for (const auto& n : groups[i].names) group_of.emplace(n, i);
  }
  rep.params_total = static_cast<int64_t>(groups.size());
  // Writes per parameter: whole-tensor loads, and per slice along dim 0 for a stacked one
  // (sized to dim 0 on the first slice load).
  std::vector<int> whole_loads(groups.size(), 0);
  std::vector<std::vector<int>> slice_loads(groups.size());
  std::vector<bool> reported(groups.size(), false);  // already named in a failure list
  auto target_of = [](const TensorSlot& slot) {
    return slot.slice < 0 ? slot.internal
                          : slot.internal + "[" + std::to_string(slot.slice) + "]";
  };

  const std::vector<std::string> keys = checkpoint.Keys();
  const std::set<std::string> key_set(keys.begin(), keys.end());
  rep.keys_total = static_cast<int64_t>(keys.size());
  torch::NoGradGuard no_grad;
  for (const std::string& key : keys) {
    if (adapter.IsTiedAlias(key)) {
      rep.tied_alias = key;
      continue;
    }
    Result<TensorSlot> slot = adapter.Resolve(key);
    if (!slot.ok()) {
      rep.unexpected.push_back(key);
      continue;
    }
    const std::string target = target_of(*slot);
    auto git = group_of.find(slot->internal);
    if (git == group_of.end()) {
      rep.unknown_params.push_back(key + " (-> " + target + ", which the model lacks)");
      continue;
    }
    const size_t g = git->second;
    const torch::Tensor& param = groups[g].tensor;
    torch::Tensor dest = param;
    std::string of_stack;  // " (slice of [E, ...])" for a stacked parameter
    if (slot->slice >= 0) {
      if (param.dim() == 0 || slot->slice >= param.size(0)) {
        rep.shape_mismatches.push_back(key + " (-> " + target + "): model " +
                                       ShapeString(param.sizes()) + " has no slice " +
                                       std::to_string(slot->slice) + " along dim 0");
        reported[g] = true;
        continue;
      }
      dest = param.select(0, slot->slice);
      of_stack = " (slice of " + ShapeString(param.sizes()) + ")";
    }
    const safetensors::TensorInfo* info = checkpoint.Info(key);
    const std::vector<int64_t> model_shape(dest.sizes().begin(), dest.sizes().end());
    // Under TP the checkpoint tensor is compared, and loaded, as this rank's shard of it.
    const ShardRule* rule = nullptr;
    const int64_t leading = slot->slice >= 0 ? 1 : 0;
    std::optional<std::vector<int64_t>> expected;
    if (info != nullptr) expected = info->shape;
    if (shard != nullptr && info != nullptr) {
      rule = shard->plan->Find(slot->internal);
      Result<std::vector<int64_t>> local =
          rule ? shard->plan->LocalShape(*rule, info->shape, leading)
               : Result<std::vector<int64_t>>(Status::NotFound("no TP plan rule covers " +
                                                               slot->internal));
      if (!local.ok()) {
        rep.shape_mismatches.push_back(key + " (-> " + target + "): " + local.status().message());
        reported[g] = true;
        continue;
      }
      expected = *local;
    }
    if (!expected || *expected != model_shape) {
      rep.shape_mismatches.push_back(
          key + " (-> " + target + "): checkpoint " +
          (info ? ShapeString(info->shape) : std::string("?")) +
          (rule ? " (local shard " + ShapeString(*expected) + ")" : std::string()) +
          " vs model " + ShapeString(dest.sizes()) + of_stack);
      reported[g] = true;
      continue;
    }
    GH_ASSIGN_OR_RETURN(torch::Tensor t, checkpoint.Load(key));
    if (rule != nullptr) {
      GH_ASSIGN_OR_RETURN(t, shard->plan->Shard(*rule, t, shard->rank, leading));
    }
    t = t.to(param.scalar_type());
    const int64_t nans = t.isnan().sum().item<int64_t>();
    const int64_t infs = t.isinf().sum().item<int64_t>();
    if (nans || infs) {
      rep.nonfinite.push_back(key + " (-> " + target + "): " + std::to_string(nans) +
                              " NaN, " + std::to_string(infs) + " Inf");
      reported[g] = true;
      continue;
    }
    dest.copy_(t);
    int* count = &whole_loads[g];
    if (slot->slice >= 0) {
      if (slice_loads[g].empty()) slice_loads[g].assign(static_cast<size_t>(param.size(0)), 0);
      count = &slice_loads[g][static_cast<size_t>(slot->slice)];
    }
    if (++*count == 2) rep.loaded_twice.push_back(target);
    ++rep.keys_used;
    rep.bytes_loaded += info->end - info->begin;
  }

  // Coverage the other way: every expected HF name present (a missing expert is named by its
  // own key), every parameter loaded (a stacked one in every slice).
  for (const std::string& hf : adapter.ExpectedHfNames()) {
    if (key_set.count(hf)) continue;
    Result<TensorSlot> slot = adapter.Resolve(hf);
    std::string label = hf;
    if (slot.ok()) {
      label += " (-> " + target_of(*slot) + ")";
      auto it = group_of.find(slot->internal);
      if (it != group_of.end()) reported[it->second] = true;
    }
    rep.missing.push_back(label);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<std::string> unloaded;  // slices of a partly loaded stacked parameter
    for (size_t s = 0; s < slice_loads[g].size(); ++s) {
      if (slice_loads[g][s] == 0) unloaded.push_back(std::to_string(s));
    }
    const bool any_slice = unloaded.size() < slice_loads[g].size();
    if (whole_loads[g] > 0 && any_slice) {
      rep.loaded_twice.push_back(groups[g].names[0] + " (as a whole and by slices)");
    }
    const bool loaded = whole_loads[g] > 0 || (!slice_loads[g].empty() && unloaded.empty());
    if (loaded) {
      ++rep.params_loaded;
    } else if (!reported[g]) {
      if (slice_loads[g].empty()) {
        rep.missing.push_back("parameter " + groups[g].names[0] +
                              " (no checkpoint key maps to it)");
      } else {
        rep.missing.push_back("parameter " + groups[g].names[0] + ": slice(s) " +
                              JoinFew(unloaded) + " of " +
                              std::to_string(slice_loads[g].size()) +
                              " along dim 0 (no checkpoint key maps to them)");
      }
    }
  }
  return rep;
}

namespace {

/// The checkpoint tensor a tied model uses as its lm_head: the expected HF tensor whose shape
/// the alias has, a name with "embed" first (the input embedding in every family we know).
/// Empty when the checkpoint holds none.
std::string TiedSource(const Checkpoint& checkpoint, const StateDictAdapter& adapter,
                       const std::string& alias) {
  const safetensors::TensorInfo* alias_info = checkpoint.Info(alias);
  if (alias_info == nullptr) return "";
  std::string fallback;
  for (const std::string& hf : adapter.ExpectedHfNames()) {
    const safetensors::TensorInfo* info = checkpoint.Info(hf);
    if (info == nullptr || info->shape != alias_info->shape) continue;
    if (hf.find("embed") != std::string::npos) return hf;
    if (fallback.empty()) fallback = hf;
  }
  return fallback;
}

/// True for a checkpoint-read error that is the input's fault (a missing, truncated or lying
/// file, an index that disagrees with its shards, a dtype LibTorch lacks).
bool IsCheckpointDataError(const Status& s) {
  return s.code() == StatusCode::kNotFound || s.code() == StatusCode::kDataLoss ||
         s.code() == StatusCode::kInvalidArgument;
}

}  // namespace

GateOutcome LoadGate(GateContext& ctx) {
  GateOutcome out;
  if (!ctx.model || !ctx.family || !ctx.args) {
    return out.Unknown(ctx.spec.Requested("construct")
                           ? "no constructed model: phase construct did not pass"
                           : "no constructed model: phase construct was not requested");
  }
  // The tensor files are opened and validated here (the config gate read config.json only).
  // A fault of the files is the input's, not the adapter's: BLOCKED, naming the file, the
  // tensor and the offsets or sizes (docs/protocols.md §4).
  const std::string where = "checkpoint " + ctx.spec.checkpoint.path;
  ctx.checkpoint.reset();
  Result<Checkpoint> opened = Checkpoint::Open(ctx.spec.checkpoint.path);
  if (!opened.ok()) return out.Blocked(where + ": " + opened.status().ToString());
  ctx.checkpoint.emplace(std::move(opened).value());
  const Checkpoint& checkpoint = *ctx.checkpoint;
  out.Count("checkpoint_files", static_cast<int64_t>(checkpoint.files().size()));
  out.Bytes("checkpoint_bytes", static_cast<int64_t>(checkpoint.total_bytes()));

  Result<StateDictAdapter> adapter = ctx.family->Adapter(*ctx.args);
  if (!adapter.ok()) {
    return out.Fail(FailureClass::kAdapterContract, "Adapter: " + adapter.status().ToString());
  }
  ctx.adapter.emplace(std::move(adapter).value());
  Result<LoadReport> loaded = LoadStateDict(checkpoint, *ctx.adapter, *ctx.model);
  if (!loaded.ok()) {
    const std::string why = where + ": reading a tensor: " + loaded.status().ToString();
    if (IsCheckpointDataError(loaded.status())) return out.Blocked(why);
    return out.Fail(FailureClass::kUnknown, why);
  }
  const LoadReport& rep = *loaded;
  ctx.load_report = rep;
  const bool tied = ctx.adapter->tie_word_embeddings();
  out.Count("keys_total", rep.keys_total);
  out.Count("keys_used", rep.keys_used);
  out.Count("keys_missing", static_cast<int64_t>(rep.missing.size()));
  out.Count("keys_unexpected", static_cast<int64_t>(rep.unexpected.size() + rep.unknown_params.size()));
  out.Count("params_loaded", rep.params_loaded);
  out.Count("params_total", rep.params_total);
  out.Bytes("bytes_loaded", static_cast<int64_t>(rep.bytes_loaded));
  out.Text("tied", tied ? "true" : "false");

  // A tied model's checkpoint that still ships lm_head.weight. Upstream (transformers 5.24
  // PreTrainedModel.tie_weights during from_pretrained) ties the two when their loaded values
  // are equal (torch.equal), so the embedding is used; when they differ it does NOT tie them
  // and uses the shipped lm_head, which a tied model cannot follow: the checkpoint contradicts
  // its own config (upstream's warning says to set tie_word_embeddings=false).
  std::vector<std::string> data_problems;  // faults of the checkpoint's data, not the adapter
  if (!rep.tied_alias.empty()) {
    const std::string source = TiedSource(checkpoint, *ctx.adapter, rep.tied_alias);
    if (source.empty()) {
      out.Text("tied_lm_head", "checkpoint ships " + rep.tied_alias +
                                   "; tie_word_embeddings=true; no checkpoint tensor of its shape "
                                   "to tie it to");
    } else {
      Result<torch::Tensor> alias_t = checkpoint.Load(rep.tied_alias);
      Result<torch::Tensor> source_t = checkpoint.Load(source);
      for (const Result<torch::Tensor>* r : {&alias_t, &source_t}) {
        if (!r->ok()) return out.Blocked(where + ": reading a tensor: " + r->status().ToString());
      }
      torch::NoGradGuard no_grad;
      const torch::Tensor a = alias_t->to(ctx.dtype), b = source_t->to(ctx.dtype);
      if (torch::equal(a, b)) {
        out.Text("tied_lm_head", "checkpoint ships " + rep.tied_alias + " (equal to " + source +
                                     "); tie_word_embeddings=true: " + source +
                                     " used (as upstream)");
      } else {
        const int64_t differing = a.ne(b).sum().item<int64_t>();
        const double max_abs = (a - b).abs().max().to(torch::kDouble).item<double>();
        data_problems.push_back(
            "tie_word_embeddings=true but the checkpoint ships " + rep.tied_alias +
            " different from " + source + " (" + std::to_string(differing) + " of " +
            std::to_string(a.numel()) + " elements differ in " +
            std::string(c10::toString(ctx.dtype)) + ", max abs diff " + Num(max_abs) +
            "): upstream would not tie them and would use " + rep.tied_alias +
            " as a separate head, which a tied model cannot do; config.json should say "
            "tie_word_embeddings=false");
      }
    }
  }

  std::vector<std::string> problems;
  auto add = [](std::vector<std::string>& to, const std::vector<std::string>& list,
                const std::string& what) {
    if (!list.empty()) {
      to.push_back(std::to_string(list.size()) + " " + what + ": " + JoinFew(list));
    }
  };
  add(problems, rep.shape_mismatches, "shape mismatch(es)");
  add(problems, rep.missing,
      std::string("missing key(s) (tie_word_embeddings=") + (tied ? "true" : "false") + ")");
  add(problems, rep.unexpected, "unexpected key(s)");
  add(problems, rep.unknown_params, "key(s) mapped to unknown parameters");
  add(problems, rep.loaded_twice, "parameter(s) loaded twice");
  add(data_problems, rep.nonfinite, "tensor(s) with NaN/Inf");
  auto join = [](const std::vector<std::string>& a, const std::vector<std::string>& b) {
    std::string reason;
    for (const auto* list : {&a, &b}) {
      for (const auto& p : *list) reason += (reason.empty() ? "" : "; ") + p;
    }
    return reason;
  };
  // Names or shapes that do not meet the adapter's table are its contract (the gate cannot
  // tell a wrong table from a mutilated checkpoint; the reason names the keys and shapes).
  // NaN/Inf or a lm_head that contradicts the config, alone, are the checkpoint's data.
  if (!problems.empty()) return out.Fail(FailureClass::kAdapterContract, join(problems, data_problems));
  if (!data_problems.empty()) return out.Blocked(where + ": " + join(data_problems, {}));
  ctx.model_loaded = true;
  return out;
}

// --- save ----------------------------------------------------------------------------------

HfTensors ToHfTensors(const std::vector<ParamGroup>& groups, const StateDictAdapter& adapter) {
  HfTensors hf;
  for (const auto& g : groups) {
    std::optional<std::vector<HfSlice>> slices;
    std::string why;
    for (const auto& name : g.names) {
      Result<std::vector<HfSlice>> r = adapter.HfSlices(name);
      if (r.ok()) {
        slices = std::move(r).value();
        break;
      }
      why = r.status().message();
    }
    if (!slices) {
      hf.unmapped.push_back(g.names[0] + " (" + why + ")");
      continue;
    }
    const bool stacked = slices->front().slice >= 0;
    const int64_t n = static_cast<int64_t>(slices->size());
    if (stacked && (g.tensor.dim() == 0 || g.tensor.size(0) != n)) {
      hf.miscounted.push_back(g.names[0] + " (shape " + ShapeString(g.tensor.sizes()) +
                           ", but the name table splits it into " + std::to_string(n) +
                           " HF tensors along dim 0)");
      continue;
    }
    for (const HfSlice& s : *slices) {
      const std::string from =
          stacked ? g.names[0] + "[" + std::to_string(s.slice) + "]" : g.names[0];
      if (!hf.hf_to_internal.emplace(s.hf, from).second) {
        hf.duplicated.push_back(s.hf + " (from " + hf.hf_to_internal[s.hf] + " and " + from + ")");
        continue;
      }
      const torch::Tensor t = g.tensor.detach();
      hf.tensors.emplace_back(s.hf, stacked ? t.select(0, s.slice) : t);
    }
  }
  return hf;
}

std::string HfTensors::Problems() const {
  std::vector<std::string> parts;
  if (!unmapped.empty()) parts.push_back("no HF name for " + JoinFew(unmapped));
  if (!duplicated.empty()) parts.push_back("HF name written twice: " + JoinFew(duplicated));
  if (!miscounted.empty()) parts.push_back("stacked parameter split wrongly: " + JoinFew(miscounted));
  std::string reason = "inverse mapping (HfSlices): ";
  for (size_t i = 0; i < parts.size(); ++i) reason += (i ? "; " : "") + parts[i];
  return reason;
}

GateOutcome SaveGate(GateContext& ctx) {
  GateOutcome out;
  if (!internal::RequireLoadedModel(ctx, out)) return out;
  if (!ctx.adapter || !ctx.checkpoint) return out.Unknown("no adapter or checkpoint from phase load");
  const StateDictAdapter& adapter = *ctx.adapter;

  const auto groups = UniqueParameters(*ctx.model);
  HfTensors hf = ToHfTensors(groups, adapter);
  out.Count("tensors_saved", static_cast<int64_t>(hf.tensors.size()));
  if (!hf.ok()) return out.Fail(FailureClass::kAdapterContract, hf.Problems());
  const auto& tensors = hf.tensors;
  auto& hf_to_internal = hf.hf_to_internal;

  // The saved key set must equal the original checkpoint's (without the tied alias).
  std::set<std::string> original;
  for (const auto& k : ctx.checkpoint->Keys()) {
    if (!adapter.IsTiedAlias(k)) original.insert(k);
  }
  std::vector<std::string> not_saved, extra;
  for (const auto& k : original) {
    if (!hf_to_internal.count(k)) not_saved.push_back(k);
  }
  for (const auto& [k, _] : hf_to_internal) {
    if (!original.count(k)) extra.push_back(k + " (from " + hf_to_internal[k] + ")");
  }
  if (!not_saved.empty() || !extra.empty()) {
    std::string reason = "saved key set differs from the checkpoint's:";
    if (!not_saved.empty()) reason += " not saved " + JoinFew(not_saved) + ";";
    if (!extra.empty()) reason += " not in the checkpoint " + JoinFew(extra) + ";";
    reason.pop_back();
    return out.Fail(FailureClass::kAdapterContract, reason);
  }

  // Write model.safetensors and copy the assets (config.json and the other non-tensor files).
  namespace fs = std::filesystem;
  const fs::path save_dir = fs::path(ctx.spec.attempt.dir) / "save";
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  if (ec) {
    return out.Fail(FailureClass::kResource, "cannot create " + save_dir.string() + ": " + ec.message());
  }
  const fs::path file = save_dir / "model.safetensors";
  Status written = safetensors::WriteTensors(file, tensors, {{"format", "pt"}});
  if (!written.ok()) {
    return out.Fail(FailureClass::kResource, "writing " + file.string() + ": " + written.ToString());
  }
  int64_t assets = 0;
  std::vector<std::string> asset_problems;
  for (const auto& entry : fs::directory_iterator(ctx.checkpoint->dir())) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || entry.path().extension() == ".safetensors" ||
        name == "model.safetensors.index.json") {
      continue;
    }
    fs::copy_file(entry.path(), save_dir / name, fs::copy_options::overwrite_existing, ec);
    Result<std::string> a = Sha256FileHex(entry.path());
    Result<std::string> b = Sha256FileHex(save_dir / name);
    if (ec || !a.ok() || !b.ok() || *a != *b) {
      asset_problems.push_back(name + (ec ? ": " + ec.message() : std::string(": copy differs")));
    }
    ++assets;
  }
  out.Count("assets_copied", assets);
  Result<std::string> digest = Sha256FileHex(file);
  const uint64_t bytes = fs::file_size(file, ec);
  out.Bytes("bytes_written", static_cast<int64_t>(bytes));
  out.artifacts.push_back({"saved_checkpoint", "save/model.safetensors", bytes,
                           digest.ok() ? *digest : std::string()});
  if (!asset_problems.empty()) {
    return out.Fail(FailureClass::kResource, "copying assets: " + JoinFew(asset_problems));
  }

  // Reload into a fresh model through the same load routine and compare bit for bit.
  Result<Checkpoint> reopened = Checkpoint::Open(save_dir);
  if (!reopened.ok()) {
    return out.Fail(FailureClass::kUnknown, "reopening the saved checkpoint: " + reopened.status().ToString());
  }
  Result<std::shared_ptr<CausalLM>> fresh = ctx.family->Construct(*ctx.args, ctx.dtype, ctx.device);
  if (!fresh.ok() || !*fresh) {
    return out.Fail(FailureClass::kAdapterContract,
                    "Construct (fresh model for reload): " +
                        (fresh.ok() ? std::string("returned no model") : fresh.status().ToString()));
  }
  Result<LoadReport> reloaded = LoadStateDict(*reopened, adapter, **fresh);
  if (!reloaded.ok()) {
    return out.Fail(FailureClass::kUnknown, "reloading the saved checkpoint: " + reloaded.status().ToString());
  }
  if (!reloaded->ok() || !reloaded->tied_alias.empty()) {
    std::vector<std::string> all = reloaded->missing;
    for (const auto* l : {&reloaded->unexpected, &reloaded->unknown_params,
                          &reloaded->shape_mismatches, &reloaded->nonfinite, &reloaded->loaded_twice}) {
      all.insert(all.end(), l->begin(), l->end());
    }
    if (!reloaded->tied_alias.empty()) all.push_back("tied alias " + reloaded->tied_alias + " written");
    return out.Fail(FailureClass::kAdapterContract, "the saved checkpoint does not load cleanly: " + JoinFew(all));
  }
  std::unordered_map<std::string, torch::Tensor> fresh_params;
  for (const auto& item : (*fresh)->named_parameters(/*recurse=*/true)) {
    fresh_params.emplace(item.key(), item.value());
  }
  int64_t compared = 0, equal = 0;
  double max_abs = 0;
  std::vector<std::string> differing;
  torch::NoGradGuard no_grad;
  for (const auto& g : groups) {
    auto it = fresh_params.find(g.names[0]);
    if (it == fresh_params.end()) {
      differing.push_back(g.names[0] + " (absent from the fresh model)");
      continue;
    }
    ++compared;
    const torch::Tensor& a = g.tensor;
    const torch::Tensor& b = it->second;
    if (a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && torch::equal(a, b)) {
      ++equal;
      continue;
    }
    double d = a.sizes() == b.sizes()
                   ? (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>()
                   : std::numeric_limits<double>::infinity();
    max_abs = std::max(max_abs, d);
    differing.push_back(g.names[0] + " (max abs diff " + Num(d) + ")");
  }
  out.Count("tensors_compared", compared);
  out.Count("tensors_equal", equal);
  out.Real("max_abs_diff", max_abs, "weight");
  if (!differing.empty()) {
    return out.Fail(FailureClass::kAdapterContract,
                    std::to_string(differing.size()) + " tensor(s) differ after save and reload: " +
                        JoinFew(differing));
  }
  return out;
}

// --- parallel, cuda_graph: in their own files ------------------------------------------------------------------

// ParallelGate: gates_parallel.cc. CudaGraphGate: gates_cuda_graph.cc.

// --- runner --------------------------------------------------------------------------------

std::vector<GateDef> DefaultGates() {
  return {{"identity", IdentityGate}, {"config", ConfigGate},   {"construct", ConstructGate},
          {"load", LoadGate},         {"inference", InferenceGate},
          {"decode", DecodeGate},     {"training", TrainingGate}, {"save", SaveGate},
          {"parallel", ParallelGate}, {"cuda_graph", CudaGraphGate},
          {"performance", PerformanceGate}};
}

namespace {

GateOutcome RunOneGate(const GateDef& def, GateContext& ctx) {
  GateOutcome out;
  try {
    return def.fn(ctx);
  } catch (const c10::Error& e) {
    out.Fail(FailureClass::kNativeRuntime, std::string("LibTorch error: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    out.Fail(FailureClass::kUnknown, std::string("exception: ") + e.what());
  } catch (...) {
    out.Fail(FailureClass::kUnknown, "unknown exception");
  }
  return out;
}

}  // namespace

GateStatus RunGates(GateContext& ctx, EventWriter& events, const std::vector<GateDef>& gates) {
  bool any_fail = false, any_blocked = false, any_unknown = false;
  std::string stopped_by;  // "<phase> ended <STATUS>"
  for (const GateDef& def : gates) {
    if (!ctx.spec.Requested(def.phase)) {
      events.PhaseEnd(def.phase, GateStatus::kSkipped, "not requested", "", 0);
      continue;
    }
    if (ctx.rank > 0 && std::find(std::begin(kPhasesOnEveryRank), std::end(kPhasesOnEveryRank),
                                  def.phase) == std::end(kPhasesOnEveryRank)) {
      events.PhaseEnd(def.phase, GateStatus::kSkipped,
                      "rank " + std::to_string(ctx.rank) + " of " +
                          std::to_string(ctx.world_size) + ": phase " + std::string(def.phase) +
                          " runs on rank 0 only",
                      "", 0);
      continue;
    }
    if (!stopped_by.empty()) {
      events.PhaseEnd(def.phase, GateStatus::kSkipped, "skipped: earlier phase " + stopped_by, "", 0);
      continue;
    }
    events.PhaseStart(def.phase);
    log::Info("phase " + std::string(def.phase) + ": start");
    const int64_t t0 = events.NowMs();
    GateOutcome out = RunOneGate(def, ctx);
    for (const Figure& f : out.figures) events.EmitFigure(def.phase, f);
    for (const Artifact& a : out.artifacts) events.EmitArtifact(def.phase, a);
    if (out.status != GateStatus::kPass && out.reason.empty()) {
      out.reason = "gate ended " + std::string(GateStatusName(out.status)) + " without a reason";
    }
    const std::string_view cls =
        out.status == GateStatus::kFail ? FailureClassName(out.classification) : "";
    events.PhaseEnd(def.phase, out.status, out.reason, cls, events.NowMs() - t0);
    log::Info("phase " + std::string(def.phase) + ": " + std::string(GateStatusName(out.status)) +
              (out.reason.empty() ? "" : ": " + out.reason));
    any_fail |= out.status == GateStatus::kFail;
    any_blocked |= out.status == GateStatus::kBlocked;
    any_unknown |= out.status == GateStatus::kUnknown;
    if (StopsLaterPhases(out.status)) {
      stopped_by = std::string(def.phase) + " ended " + std::string(GateStatusName(out.status));
    }
  }
  const GateStatus overall = any_fail      ? GateStatus::kFail
                             : any_blocked ? GateStatus::kBlocked
                             : any_unknown ? GateStatus::kUnknown
                                           : GateStatus::kPass;
  events.RunEnd(overall);
  return overall;
}

}  // namespace gatehouse::worker
