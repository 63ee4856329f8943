// The runner and the structural gates: identity, config, construct, load, save, parallel,
// cuda_graph (DESIGN.md "Phases"). The numerical gates are in gates_compute.cc.
#include "gatehouse/worker/gates.h"

#include <caffe2/core/common.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "common/sha256.h"
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
  return info;
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

  // The environment does not match the pin: BLOCKED, never silently accepted (DESIGN.md).
  std::vector<std::string> blocks;
  if (spec.runtime.torch != ctx.runtime.torch_version) {
    blocks.push_back("runtime pin torch " + spec.runtime.torch + " but the worker runs torch " +
                     ctx.runtime.torch_version);
  }
  if (StripLocalVersion(ctx.runtime.torch_headers_version) != ctx.runtime.torch_version) {
    blocks.push_back("worker built against torch " + ctx.runtime.torch_headers_version +
                     " headers but runs library " + ctx.runtime.torch_version);
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
  Result<Checkpoint> ckpt = Checkpoint::Open(ctx.spec.checkpoint.path);
  if (!ckpt.ok()) {
    return out.Fail(FailureClass::kUnknown,
                    "checkpoint " + ctx.spec.checkpoint.path + ": " + ckpt.status().ToString());
  }
  ctx.checkpoint.emplace(std::move(ckpt).value());
  const nlohmann::json& config = ctx.checkpoint->config();
  out.Count("checkpoint_tensors", static_cast<int64_t>(ctx.checkpoint->Keys().size()));
  out.Bytes("checkpoint_bytes", static_cast<int64_t>(ctx.checkpoint->total_bytes()));

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

  // TP divisibility (GATES-NOTES.md "Tensor parallelism"): checked at config time.
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
  ctx.device = torch::Device(ctx.spec.runtime.device);
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
                                 CausalLM& model) {
  LoadReport rep;
  const auto groups = UniqueParameters(model);
  std::unordered_map<std::string, size_t> group_of;
  for (size_t i = 0; i < groups.size(); ++i) {
    for (const auto& n : groups[i].names) group_of.emplace(n, i);
  }
  rep.params_total = static_cast<int64_t>(groups.size());
  std::vector<int> loads(groups.size(), 0);
  std::vector<bool> reported(groups.size(), false);  // already named in a failure list

  const std::vector<std::string> keys = checkpoint.Keys();
  const std::set<std::string> key_set(keys.begin(), keys.end());
  rep.keys_total = static_cast<int64_t>(keys.size());
  torch::NoGradGuard no_grad;
  for (const std::string& key : keys) {
    if (adapter.IsTiedAlias(key)) {
      rep.tied_alias = key;
      continue;
    }
    Result<std::string> internal = adapter.ToInternal(key);
    if (!internal.ok()) {
      rep.unexpected.push_back(key);
      continue;
    }
    auto git = group_of.find(*internal);
    if (git == group_of.end()) {
      rep.unknown_params.push_back(key + " (-> " + *internal + ", which the model lacks)");
      continue;
    }
    const size_t g = git->second;
    torch::Tensor param = groups[g].tensor;
    const safetensors::TensorInfo* info = checkpoint.Info(key);
    const std::vector<int64_t> model_shape(param.sizes().begin(), param.sizes().end());
    if (info == nullptr || info->shape != model_shape) {
      rep.shape_mismatches.push_back(
          key + " (-> " + *internal + "): checkpoint " +
          (info ? ShapeString(info->shape) : std::string("?")) + " vs model " +
          ShapeString(param.sizes()));
      reported[g] = true;
      continue;
    }
    GH_ASSIGN_OR_RETURN(torch::Tensor t, checkpoint.Load(key));
    t = t.to(param.scalar_type());
    const int64_t nans = t.isnan().sum().item<int64_t>();
    const int64_t infs = t.isinf().sum().item<int64_t>();
    if (nans || infs) {
      rep.nonfinite.push_back(key + " (-> " + *internal + "): " + std::to_string(nans) +
                              " NaN, " + std::to_string(infs) + " Inf");
      reported[g] = true;
      continue;
    }
    param.copy_(t);
    if (++loads[g] == 2) rep.loaded_twice.push_back(*internal);
    ++rep.keys_used;
    rep.bytes_loaded += info->end - info->begin;
  }

  // Coverage the other way: every expected HF name present, every parameter loaded.
  for (const std::string& hf : adapter.ExpectedHfNames()) {
    if (key_set.count(hf)) continue;
    Result<std::string> internal = adapter.ToInternal(hf);
    std::string label = hf;
    if (internal.ok()) {
      label += " (-> " + *internal + ")";
      if (auto it = group_of.find(*internal); it != group_of.end()) reported[it->second] = true;
    }
    rep.missing.push_back(label);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (loads[g] > 0) {
      ++rep.params_loaded;
    } else if (!reported[g]) {
      rep.missing.push_back("parameter " + groups[g].names[0] +
                            " (no checkpoint key maps to it)");
    }
  }
  return rep;
}

GateOutcome LoadGate(GateContext& ctx) {
  GateOutcome out;
  if (!ctx.model || !ctx.checkpoint || !ctx.family || !ctx.args) {
    return out.Unknown(ctx.spec.Requested("construct")
                           ? "no constructed model: phase construct did not pass"
                           : "no constructed model: phase construct was not requested");
  }
  Result<StateDictAdapter> adapter = ctx.family->Adapter(*ctx.args);
  if (!adapter.ok()) {
    return out.Fail(FailureClass::kAdapterContract, "Adapter: " + adapter.status().ToString());
  }
  ctx.adapter.emplace(std::move(adapter).value());
  Result<LoadReport> loaded = LoadStateDict(*ctx.checkpoint, *ctx.adapter, *ctx.model);
  if (!loaded.ok()) {
    return out.Fail(FailureClass::kUnknown, "reading the checkpoint: " + loaded.status().ToString());
  }
  const LoadReport& rep = *loaded;
  ctx.load_report = rep;
  out.Count("keys_total", rep.keys_total);
  out.Count("keys_used", rep.keys_used);
  out.Count("keys_missing", static_cast<int64_t>(rep.missing.size()));
  out.Count("keys_unexpected", static_cast<int64_t>(rep.unexpected.size() + rep.unknown_params.size()));
  out.Count("params_loaded", rep.params_loaded);
  out.Count("params_total", rep.params_total);
  out.Bytes("bytes_loaded", static_cast<int64_t>(rep.bytes_loaded));
  out.Text("tied", ctx.adapter->tie_word_embeddings() ? "true" : "false");
  if (!rep.tied_alias.empty()) {
    // Name the weight used instead: the expected tensor whose shape the alias has (the input
    // embedding for every family we know).
    std::string used = "the input embedding";
    if (const auto* alias = ctx.checkpoint->Info(rep.tied_alias)) {
      for (const auto& hf : ctx.adapter->ExpectedHfNames()) {
        const auto* info = ctx.checkpoint->Info(hf);
        if (info && info->shape == alias->shape) {
          used = hf;
          break;
        }
      }
    }
    out.Text("tied_lm_head", "checkpoint ships " + rep.tied_alias +
                                 "; tie_word_embeddings=true: " + used + " used (as upstream)");
  }

  std::vector<std::string> problems;
  auto add = [&](const std::vector<std::string>& list, const char* what) {
    if (!list.empty()) {
      problems.push_back(std::to_string(list.size()) + " " + what + ": " + JoinFew(list));
    }
  };
  add(rep.shape_mismatches, "shape mismatch(es)");
  add(rep.missing, "missing key(s)");
  add(rep.unexpected, "unexpected key(s)");
  add(rep.unknown_params, "key(s) mapped to unknown parameters");
  add(rep.loaded_twice, "parameter(s) loaded twice");
  const bool contract = !problems.empty();
  add(rep.nonfinite, "tensor(s) with NaN/Inf");
  if (!problems.empty()) {
    std::string reason;
    for (const auto& p : problems) reason += (reason.empty() ? "" : "; ") + p;
    // NaN/Inf alone is the checkpoint's data, not the adapter's mapping.
    return out.Fail(contract ? FailureClass::kAdapterContract : FailureClass::kUnknown, reason);
  }
  ctx.model_loaded = true;
  return out;
}

// --- save ----------------------------------------------------------------------------------

GateOutcome SaveGate(GateContext& ctx) {
  GateOutcome out;
  if (!internal::RequireLoadedModel(ctx, out)) return out;
  if (!ctx.adapter || !ctx.checkpoint) return out.Unknown("no adapter or checkpoint from phase load");
  const StateDictAdapter& adapter = *ctx.adapter;

  // Inverse mapping: every parameter gets its HF name.
  const auto groups = UniqueParameters(*ctx.model);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::vector<std::string> unmapped, duplicated;
  std::map<std::string, std::string> hf_to_internal;
  for (const auto& g : groups) {
    std::optional<std::string> hf;
    std::string why;
    for (const auto& name : g.names) {
      Result<std::string> r = adapter.ToHf(name);
      if (r.ok()) {
        hf = *r;
        break;
      }
      why = r.status().message();
    }
    if (!hf) {
      unmapped.push_back(g.names[0] + " (" + why + ")");
      continue;
    }
    if (!hf_to_internal.emplace(*hf, g.names[0]).second) {
      duplicated.push_back(*hf + " (from " + hf_to_internal[*hf] + " and " + g.names[0] + ")");
      continue;
    }
    tensors.emplace_back(*hf, g.tensor.detach());
  }
  out.Count("tensors_saved", static_cast<int64_t>(tensors.size()));
  if (!unmapped.empty() || !duplicated.empty()) {
    std::string reason = "inverse mapping (ToHf): ";
    if (!unmapped.empty()) reason += "no HF name for " + JoinFew(unmapped);
    if (!duplicated.empty()) {
      reason += std::string(unmapped.empty() ? "" : "; ") + "HF name written twice: " + JoinFew(duplicated);
    }
    return out.Fail(FailureClass::kAdapterContract, reason);
  }

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

// --- parallel, cuda_graph ------------------------------------------------------------------

GateOutcome ParallelGate(GateContext& ctx) {
  GateOutcome out;
  const auto& t = ctx.spec.topology;
  out.Count("world_size", t.world_size());
  const std::string topo = "topology tp=" + std::to_string(t.tp) + " dp=" + std::to_string(t.dp) +
                           " pp=" + std::to_string(t.pp);
  if (t.world_size() == 1) {
    return out.Skipped(topo + ": world size 1, nothing to compare against TP=1");
  }
  return out.Blocked(topo + ": tensor parallelism not implemented yet (issue 4)");
}

GateOutcome CudaGraphGate(GateContext& ctx) {
  GateOutcome out;
  if (!ctx.runtime.cuda_available) {
    return out.Skipped("no CUDA device: torch::cuda::is_available() is false");
  }
  if (ctx.spec.mode == "cuda_graph") return out.Blocked("CUDA-graph decode not implemented yet (issue 4)");
  return out.Skipped("mode eager: CUDA-graph decode not requested");
}

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
