// The checkpoint gates: load (every key consumed, every parameter assigned, shapes and dtypes
// as the checkpoint says) and save (save_pretrained's layout, reloaded bit for bit).
#include "gatehouse/worker/gates.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "common/sha256.h"
#include "gatehouse/worker/safetensors_torch.h"
#include "gates_internal.h"

namespace gatehouse::worker {

using internal::JoinFew;
using internal::Num;
using internal::ShapeString;

// --- load ----------------------------------------------------------------------------------

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

  // A name table (C++ families) or the adapter's own code (the Python lane's from_hf/to_hf,
  // proved by its round trip: state_dict_io).
  const bool by_code = ctx.family->MapsWeightsByCode();
  out.Text("weight_mapping", by_code ? "code: from_hf, proved by to_hf(from_hf(checkpoint))"
                                     : "name table");
  Result<LoadReport> loaded = Status::Internal("not loaded");
  if (by_code) {
    loaded = LoadStateDictByCode(checkpoint, *ctx.family, *ctx.args, *ctx.model);
  } else {
    Result<StateDictAdapter> adapter = ctx.family->Adapter(*ctx.args);
    if (!adapter.ok()) {
      return out.Fail(FailureClass::kAdapterContract, "Adapter: " + adapter.status().ToString());
    }
    ctx.adapter.emplace(std::move(adapter).value());
    loaded = LoadStateDict(checkpoint, *ctx.adapter, *ctx.model,
                           /*shard=*/nullptr, ctx.checkpoint_scan.get());
  }
  if (!loaded.ok()) {
    const std::string why = where + ": reading a tensor: " + loaded.status().ToString();
    if (IsCheckpointDataError(loaded.status())) return out.Blocked(why);
    return out.Fail(FailureClass::kUnknown, why);
  }
  const LoadReport& rep = *loaded;
  ctx.load_report = rep;
  const bool tied = ctx.args->tie_word_embeddings();
  out.Count("keys_total", rep.keys_total);
  out.Count("keys_used", rep.keys_used);
  out.Count("keys_missing", static_cast<int64_t>(rep.missing.size()));
  out.Count("keys_unexpected", static_cast<int64_t>(rep.unexpected.size() + rep.unknown_params.size()));
  out.Count("params_loaded", rep.params_loaded);
  out.Count("params_total", rep.params_total);
  out.Bytes("bytes_loaded", static_cast<int64_t>(rep.bytes_loaded));
  out.Bytes("bytes_adopted", static_cast<int64_t>(rep.bytes_adopted));
  out.Real("finite_check_ms", rep.finite_check_ms, "ms");
  out.Bytes("bytes_finite_from_scan", static_cast<int64_t>(rep.bytes_finite_from_scan));
  out.Text("tied", tied ? "true" : "false");

  // A tied model's checkpoint that still ships lm_head.weight. Upstream (transformers 5.24
  // PreTrainedModel.tie_weights during from_pretrained) ties the two when their loaded values
  // are equal (torch.equal), so the embedding is used; when they differ it does NOT tie them
  // and uses the shipped lm_head, which a tied model cannot follow: the checkpoint contradicts
  // its own config (upstream's warning says to set tie_word_embeddings=false).
  std::vector<std::string> data_problems;  // faults of the checkpoint's data, not the adapter
  if (!rep.tied_alias.empty() && ctx.adapter) {
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
  if (!rep.adapter_error.empty()) problems.push_back(rep.adapter_error);
  add(problems, rep.round_trip, "key(s) not given back by to_hf(from_hf(checkpoint))");
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

GateOutcome SaveGate(GateContext& ctx) {
  GateOutcome out;
  if (!internal::RequireLoadedModel(ctx, out)) return out;
  const bool by_code = ctx.family->MapsWeightsByCode();
  if ((!ctx.adapter && !by_code) || !ctx.checkpoint) {
    return out.Unknown("no adapter or checkpoint from phase load");
  }

  const auto groups = UniqueParameters(*ctx.model);
  HfTensors hf = internal::HfNamesOf(ctx, groups);
  out.Count("tensors_saved", static_cast<int64_t>(hf.tensors.size()));
  if (!hf.ok()) return out.Fail(FailureClass::kAdapterContract, hf.Problems());
  const auto& tensors = hf.tensors;
  auto& hf_to_internal = hf.hf_to_internal;

  // The saved key set must equal the original checkpoint's (without the tied alias).
  std::set<std::string> original;
  for (const auto& k : ctx.checkpoint->Keys()) {
    // A Python-lane adapter's to_hf gives the checkpoint's own keys, the alias too if read.
    if (by_code || !ctx.adapter->IsTiedAlias(k)) original.insert(k);
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
  Result<std::shared_ptr<CausalLM>> fresh = [&] {
    const SkipWeightInit loaded_next;  // the reload below overwrites every parameter
    return ctx.family->Construct(*ctx.args, ctx.dtype, ctx.device);
  }();
  if (!fresh.ok() || !*fresh) {
    return out.Fail(FailureClass::kAdapterContract,
                    "Construct (fresh model for reload): " +
                        (fresh.ok() ? std::string("returned no model") : fresh.status().ToString()));
  }
  Result<LoadReport> reloaded = by_code
                                    ? LoadStateDictByCode(*reopened, *ctx.family, *ctx.args, **fresh)
                                    : LoadStateDict(*reopened, *ctx.adapter, **fresh);
  if (!reloaded.ok()) {
    return out.Fail(FailureClass::kUnknown, "reloading the saved checkpoint: " + reloaded.status().ToString());
  }
  if (!reloaded->ok() || !reloaded->tied_alias.empty()) {
    std::vector<std::string> all = reloaded->missing;
    for (const auto* l : {&reloaded->unexpected, &reloaded->unknown_params,
                          &reloaded->shape_mismatches, &reloaded->nonfinite, &reloaded->loaded_twice,
                          &reloaded->round_trip}) {
      all.insert(all.end(), l->begin(), l->end());
    }
    if (!reloaded->adapter_error.empty()) all.push_back(reloaded->adapter_error);
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

}  // namespace gatehouse::worker
