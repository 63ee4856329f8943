// State-dict I/O for the gates: loading a checkpoint through a family's adapter with key
// coverage both ways (LoadStateDict), the model's unique parameters (tied weights once), and
// the model's tensors under checkpoint names for saving (ToHfTensors). docs/gate-facts.md
// "Sharded checkpoints and tied weights".
#include "gatehouse/worker/gates.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "gatehouse/worker/safetensors_torch.h"
#include "gates_internal.h"

namespace gatehouse::worker {

using internal::JoinFew;
using internal::Num;
using internal::ShapeString;

namespace {

// (NaN count, Inf count) of a floating tensor: one reduction in the common case
// (internal::SumProvesFinite), element by element only when the sum is not finite.
std::pair<int64_t, int64_t> CountNonFinite(const torch::Tensor& t) {
  if (!t.is_floating_point() || internal::SumProvesFinite(t)) return {0, 0};
  return {t.isnan().sum().item<int64_t>(), t.isinf().sum().item<int64_t>()};
}

// Whether `param` may become `view` (a tensor of the checkpoint's mapping) instead of a copy
// of it, as transformers' from_pretrained hands out mapped tensors: same dtype, shape and
// strides on the CPU, a whole parameter (not a slice of a stacked one, not a TP shard), a
// mapping that training may write (private copy-on-write), and no other tensor viewing the
// parameter's storage (a view made at construction would keep the old bytes). Then load costs
// no copy and no second resident copy of the weights.
bool CanAdopt(const torch::Tensor& param, const torch::Tensor& view, bool partial,
              bool copy_on_write) {
  return !partial && copy_on_write && param.device().is_cpu() && view.device().is_cpu() &&
         param.scalar_type() == view.scalar_type() && param.sizes() == view.sizes() &&
         param.strides() == view.strides() && param.layout() == torch::kStrided &&
         param.storage_offset() == 0 && param.has_storage() &&
         param.storage().use_count() == 1;
}

// Every name of every group -> the group's index.
std::unordered_map<std::string, size_t> GroupOfName(const std::vector<ParamGroup>& groups) {
  std::unordered_map<std::string, size_t> group_of;
  for (size_t i = 0; i < groups.size(); ++i) {
    for (const auto& n : groups[i].names) group_of.emplace(n, i);
  }
  return group_of;
}

}  // namespace

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

Result<LoadReport> LoadStateDict(const Checkpoint& checkpoint, const StateDictAdapter& adapter,
                                 CausalLM& model, const ShardedLoad* shard,
                                 const safetensors::FiniteScan* scan) {
  LoadReport rep;
  const auto groups = UniqueParameters(model);
  const std::unordered_map<std::string, size_t> group_of = GroupOfName(groups);
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
    // Under expert parallelism a stacked parameter holds this rank's experts: the slice of
    // expert e is e - ep_rank * n (n local experts); another rank's expert is not loaded here.
    if (slot->slice >= 0 && shard != nullptr && shard->ep_size > 1 && param.dim() > 0) {
      const int64_t n = param.size(0), first = shard->ep_rank * n;
      if (slot->slice < first || slot->slice >= first + n) {
        ++rep.keys_other_ranks;
        continue;
      }
      slot->slice -= first;
    }
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
    if (shard != nullptr && shard->plan != nullptr && info != nullptr) {
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
    GH_ASSIGN_OR_RETURN(torch::Tensor t, checkpoint.View(key));
    if (rule != nullptr) {
      GH_ASSIGN_OR_RETURN(t, shard->plan->Shard(*rule, t, shard->rank, leading));
    }
    const bool adopted = CanAdopt(dest, t, slot->slice >= 0 || rule != nullptr,
                                  checkpoint.CopyOnWrite(key));
    if (adopted) {
      // The parameter becomes the mapped bytes (docs/gate-facts.md "Loading at real sizes").
      dest.set_data(t);
      rep.bytes_adopted += info->end - info->begin;
      rep.adopted_keys.push_back(key);  // keys come sorted
    } else {
      // From the mapped file straight into the parameter: one pass that converts dtype and
      // device, no intermediate tensor; then the file's pages leave the resident set, so
      // peak memory stays near the model's bytes.
      dest.copy_(t);
      t = torch::Tensor();
      checkpoint.Release(key);
    }
    // An adopted parameter is the file's bytes, which the identity gate's scan counted while
    // hashing them; any other is counted as the model holds it, after conversion.
    std::optional<safetensors::NonFiniteCount> scanned;
    if (adopted && scan != nullptr) {
      scanned = scan->Find(checkpoint.FileOf(key), key, info->begin, info->end);
    }
    int64_t nans = 0, infs = 0;
    if (scanned) {
      nans = scanned->nan;
      infs = scanned->inf;
      rep.bytes_finite_from_scan += info->end - info->begin;
    } else {
      const double check_start = internal::NowMsSteady();
      std::tie(nans, infs) = CountNonFinite(dest);
      rep.finite_check_ms += internal::NowMsSteady() - check_start;
    }
    if (nans || infs) {
      rep.nonfinite.push_back(key + " (-> " + target + "): " + std::to_string(nans) +
                              " NaN, " + std::to_string(infs) + " Inf");
      reported[g] = true;
      continue;
    }
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

Result<LoadReport> LoadStateDictByCode(const Checkpoint& checkpoint, const ModelFamily& family,
                                       const ModelArgs& args, CausalLM& model) {
  LoadReport rep;
  const auto groups = UniqueParameters(model);
  const std::unordered_map<std::string, size_t> group_of = GroupOfName(groups);
  rep.params_total = static_cast<int64_t>(groups.size());
  const std::vector<std::string> keys = checkpoint.Keys();
  rep.keys_total = static_cast<int64_t>(keys.size());
  NamedTensors hf;
  hf.reserve(keys.size());
  for (const std::string& key : keys) {
    // The adapter may write its input in place: a read-only mapping is copied first.
    GH_ASSIGN_OR_RETURN(torch::Tensor t, checkpoint.CopyOnWrite(key) ? checkpoint.View(key)
                                                                      : checkpoint.Load(key));
    hf.emplace_back(key, std::move(t));
  }
  Result<NamedTensors> mapped = family.FromHf(args, hf);
  if (!mapped.ok()) {
    rep.adapter_error = "from_hf: " + mapped.status().message();
    return rep;
  }
  torch::NoGradGuard no_grad;
  std::vector<int> loads(groups.size(), 0);
  std::vector<bool> reported(groups.size(), false);
  for (const auto& [name, t] : *mapped) {
    auto git = group_of.find(name);
    if (git == group_of.end()) {
      rep.unknown_params.push_back(name + " (from_hf names no parameter of the model)");
      continue;
    }
    const size_t g = git->second;
    const torch::Tensor& param = groups[g].tensor;
    if (!t.defined() || t.sizes() != param.sizes()) {
      rep.shape_mismatches.push_back(
          name + ": from_hf " + (t.defined() ? ShapeString(t.sizes()) : std::string("None")) +
          " vs model " + ShapeString(param.sizes()));
      reported[g] = true;
      continue;
    }
    if (++loads[g] == 2) {
      rep.loaded_twice.push_back(name);
      continue;
    }
    param.copy_(t);
    const double check_start = internal::NowMsSteady();
    const auto [nans, infs] = CountNonFinite(param);
    rep.finite_check_ms += internal::NowMsSteady() - check_start;
    if (nans || infs) {
      rep.nonfinite.push_back(name + ": " + std::to_string(nans) + " NaN, " +
                              std::to_string(infs) + " Inf");
      reported[g] = true;
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (loads[g] > 0) {
      ++rep.params_loaded;
    } else if (!reported[g]) {
      rep.missing.push_back("parameter " + groups[g].names[0] + " (from_hf assigns nothing to it)");
    }
  }
  hf.clear();  // the round trip below needs only what from_hf returned

  // Every key consumed: to_hf(from_hf(checkpoint)) is the checkpoint again, bit for bit.
  Result<NamedTensors> back = family.ToHf(args, *mapped);
  if (!back.ok()) {
    rep.round_trip.push_back("to_hf(from_hf(checkpoint)): " + back.status().message());
    return rep;
  }
  std::map<std::string, torch::Tensor> by_key(back->begin(), back->end());
  for (const std::string& key : keys) {
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      rep.unexpected.push_back(key + " (to_hf(from_hf(checkpoint)) lacks it: from_hf did not "
                                     "consume it, or to_hf cannot name it)");
      continue;
    }
    GH_ASSIGN_OR_RETURN(torch::Tensor original, checkpoint.View(key));
    const torch::Tensor& again = it->second;
    if (!again.defined() || again.scalar_type() != original.scalar_type() ||
        again.sizes() != original.sizes() || !torch::equal(again.cpu(), original)) {
      rep.round_trip.push_back(
          key + " (to_hf(from_hf(checkpoint)) gives " +
          (again.defined() ? std::string(c10::toString(again.scalar_type())) + " " +
                                 ShapeString(again.sizes())
                           : std::string("None")) +
          ", checkpoint " + c10::toString(original.scalar_type()) + " " +
          ShapeString(original.sizes()) + (again.defined() && again.sizes() == original.sizes()
                                                ? ", values differ)" : ")"));
      continue;
    }
    ++rep.keys_used;
    const safetensors::TensorInfo* info = checkpoint.Info(key);
    if (info != nullptr) rep.bytes_loaded += info->end - info->begin;
    by_key.erase(it);
  }
  for (const auto& [key, _] : by_key) {
    if (!std::binary_search(keys.begin(), keys.end(), key)) {
      rep.round_trip.push_back(key + " (to_hf(from_hf(checkpoint)) invents it)");
    }
  }
  return rep;
}

HfTensors ToHfTensorsByCode(const std::vector<ParamGroup>& groups, const ModelFamily& family,
                            const ModelArgs& args) {
  HfTensors hf;
  for (const auto& g : groups) {
    Result<NamedTensors> r = family.ToHf(args, {{g.names[0], g.tensor.detach()}});
    if (!r.ok()) {
      hf.unmapped.push_back(g.names[0] + " (to_hf: " + r.status().message() + ")");
      continue;
    }
    for (auto& [key, t] : *r) {
      if (!hf.hf_to_internal.emplace(key, g.names[0]).second) {
        hf.duplicated.push_back(key + " (from " + hf.hf_to_internal[key] + " and " + g.names[0] + ")");
        continue;
      }
      hf.tensors.emplace_back(key, t);
    }
  }
  return hf;
}

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
  std::string reason = "inverse mapping (HfSlices, or to_hf for a Python-lane adapter): ";
  for (size_t i = 0; i < parts.size(); ++i) reason += (i ? "; " : "") + parts[i];
  return reason;
}

}  // namespace gatehouse::worker
