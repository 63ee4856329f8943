// Reference bundle reader (format in reference.h).
#include "gatehouse/worker/reference.h"

#include <fstream>
#include <sstream>

#include "gatehouse/worker/safetensors.h"
#include "gatehouse/worker/safetensors_torch.h"
#include "gates_internal.h"

namespace gatehouse::worker {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Tensor `name` of `file`, checked for its dtype and rank. Logits (float32) are views of the
/// mapped file (ViewTensor), not copies: 0.65 GB of them cost no copy and no fresh pages, and
/// their pages leave the resident set when the last view goes. Ids are small owned copies, so
/// a gate that keeps the prompts' ids (training drops the bundle and keeps them) does not keep
/// the whole mapping, and the logits pages it touched, alive.
Result<torch::Tensor> ReadChecked(const safetensors::File& file, const std::string& name,
                                  safetensors::Dtype dtype, size_t rank) {
  const safetensors::TensorInfo* info = file.Find(name);
  if (info == nullptr) {
    return Status::NotFound(file.path().string() + " has no tensor '" + name + "'");
  }
  if (info->dtype != dtype || info->shape.size() != rank) {
    return Status::InvalidArgument(
        file.path().string() + ": tensor '" + name + "' is " +
        std::string(safetensors::DtypeName(info->dtype)) + " " + ShapeString(info->shape) +
        "; expected " + std::string(safetensors::DtypeName(dtype)) + " of rank " +
        std::to_string(rank));
  }
  if (dtype == safetensors::Dtype::kF32) return safetensors::ViewTensor(file, *info);
  return safetensors::ReadTensor(file, *info);
}

/// OK when every element of `t` (floating) is finite, else names the tensor, the first
/// offending position and its value: a NaN in upstream's logits would fail every bar and blame
/// the adapter for the reference's fault.
Status RequireFinite(const torch::Tensor& t, const std::string& name) {
  // One reduction in the common case; element by element only when the sum is not finite.
  if (internal::SumProvesFinite(t)) return Status::Ok();
  const auto bad = torch::isfinite(t).logical_not();
  if (!bad.any().item<bool>()) return Status::Ok();
  const auto at = bad.nonzero()[0].contiguous();  // the first offending element's index
  std::vector<int64_t> index(at.data_ptr<int64_t>(), at.data_ptr<int64_t>() + at.numel());
  torch::Tensor element = t;
  for (int64_t i : index) element = element[i];
  const double value = element.item<double>();
  return Status::InvalidArgument("reference tensor '" + name + "' holds " + std::to_string(value) +
                                 " at " + ShapeString(index) + "; upstream's logits must be finite");
}

/// OK when every id of `ids` (int64) lies in [0, vocab), else names the tensor, the position and
/// the id.
Status RequireIdsBelow(const torch::Tensor& ids, int64_t vocab, const std::string& name) {
  const auto bad = (ids < 0).logical_or(ids >= vocab);
  if (!bad.any().item<bool>()) return Status::Ok();
  const int64_t at = bad.nonzero()[0][0].item<int64_t>();
  return Status::InvalidArgument("reference tensor '" + name + "' holds token id " +
                                 std::to_string(ids[at].item<int64_t>()) + " at position " +
                                 std::to_string(at) + ", outside the vocabulary [0, " +
                                 std::to_string(vocab) + ")");
}

/// Reads one run's four tensors ("" fp32, "_bf16") of prompt `prefix` and checks their shapes
/// against the prompt length `t`, their values (finite logits, greedy ids inside the
/// vocabulary) and that at least one token was decoded.
Result<ReferenceRun> ReadRun(const safetensors::File& file, const std::string& prefix,
                             const std::string& suffix, int64_t t) {
  ReferenceRun run;
  const std::string logits = prefix + "logits" + suffix, greedy = prefix + "greedy_ids" + suffix,
                    decode = prefix + "decode_logits" + suffix,
                    continuation = prefix + "continuation_logits" + suffix;
  GH_ASSIGN_OR_RETURN(run.logits, ReadChecked(file, logits, safetensors::Dtype::kF32, 2));
  GH_ASSIGN_OR_RETURN(run.greedy_ids, ReadChecked(file, greedy, safetensors::Dtype::kI64, 1));
  GH_ASSIGN_OR_RETURN(run.decode_logits, ReadChecked(file, decode, safetensors::Dtype::kF32, 2));
  GH_ASSIGN_OR_RETURN(run.continuation_logits,
                      ReadChecked(file, continuation, safetensors::Dtype::kF32, 2));
  if (run.logits.size(0) != t) {
    return Status::InvalidArgument("reference tensor '" + logits + "' has " +
                                   std::to_string(run.logits.size(0)) + " rows but '" + prefix +
                                   "input_ids' has " + std::to_string(t) + " tokens");
  }
  const int64_t v = run.logits.size(1), n = run.greedy_ids.size(0);
  if (v < 1) return Status::InvalidArgument("reference tensor '" + logits + "' has no column");
  if (n < 1) return Status::InvalidArgument("reference tensor '" + greedy + "' is empty");
  for (const auto& [name, tensor] : {std::pair{&decode, &run.decode_logits},
                                     std::pair{&continuation, &run.continuation_logits}}) {
    if (tensor->size(0) != n || tensor->size(1) != v) {
      return Status::InvalidArgument("reference tensor '" + *name + "' has shape " +
                                     ShapeString(tensor->sizes().vec()) + "; expected [" +
                                     std::to_string(n) + ", " + std::to_string(v) + "] ('" +
                                     greedy + "' tokens x vocabulary)");
    }
  }
  GH_RETURN_IF_ERROR(RequireIdsBelow(run.greedy_ids, v, greedy));
  for (const auto& [name, tensor] : {std::pair{&logits, &run.logits},
                                     std::pair{&decode, &run.decode_logits},
                                     std::pair{&continuation, &run.continuation_logits}}) {
    GH_RETURN_IF_ERROR(RequireFinite(*tensor, *name));
  }
  return run;
}

/// `trace`.`name`: an object of checkpoint key -> number, into `out`; `field` names the trace
/// in errors.
Status ParseKeyNumbers(const nlohmann::json& trace, const std::string& name,
                       const std::string& field, std::map<std::string, double>& out) {
  auto obj = trace.find(name);
  if (obj == trace.end() || !obj->is_object()) {
    return Status::InvalidArgument(field + "." + name + "' is missing or not an object");
  }
  for (auto n = obj->begin(); n != obj->end(); ++n) {
    if (!n->is_number()) {
      return Status::InvalidArgument(field + "." + name + "." + n.key() + "' is " + n->dump() +
                                     ", not a number");
    }
    out[n.key()] = n->get<double>();
  }
  return Status::Ok();
}

/// reference.json "training"."<precision>".
Result<TrainingTrace> ParseTrace(const nlohmann::json& training, const std::string& precision,
                                 int64_t steps, const std::string& where) {
  const std::string field = where + ": field 'training." + precision;
  auto it = training.find(precision);
  if (it == training.end() || !it->is_object()) {
    return Status::InvalidArgument(field + "' is missing or not an object");
  }
  TrainingTrace trace;
  auto losses = it->find("losses");
  if (losses == it->end() || !losses->is_array() ||
      static_cast<int64_t>(losses->size()) != steps) {
    return Status::InvalidArgument(field + ".losses' must be a list of training.steps = " +
                                   std::to_string(steps) + " numbers");
  }
  for (const auto& l : *losses) {
    if (!l.is_number()) {
      return Status::InvalidArgument(field + ".losses' holds " + l.dump() + ", not a number");
    }
    trace.losses.push_back(l.get<double>());
  }
  GH_RETURN_IF_ERROR(ParseKeyNumbers(*it, "grad_norms", field, trace.grad_norms));
  GH_RETURN_IF_ERROR(ParseKeyNumbers(*it, "grad_sums", field, trace.grad_sums));
  auto trainable = it->find("trainable");
  if (trainable == it->end() || !trainable->is_array()) {
    return Status::InvalidArgument(field + ".trainable' is missing or not a list");
  }
  for (const auto& k : *trainable) {
    if (!k.is_string() || !trace.grad_norms.count(k.get<std::string>()) ||
        !trace.grad_sums.count(k.get<std::string>())) {
      return Status::InvalidArgument(field + ".trainable' names " + k.dump() +
                                     ", which has no entry in grad_norms and grad_sums");
    }
    trace.trainable.push_back(k.get<std::string>());
  }
  auto changed = it->find("first_changed_step");
  if (changed == it->end() || !changed->is_object()) {
    return Status::InvalidArgument(field + ".first_changed_step' is missing or not an object");
  }
  for (auto c = changed->begin(); c != changed->end(); ++c) {
    if (!c->is_null() && !(c->is_number_integer() && c->get<int64_t>() >= 1)) {
      return Status::InvalidArgument(field + ".first_changed_step." + c.key() + "' is " +
                                     c->dump() + ", not a step number or null");
    }
    trace.first_changed_step[c.key()] = c->is_null() ? 0 : c->get<int64_t>();
  }
  auto floor = it->find("floor");
  if (floor == it->end() || !floor->is_object()) {
    return Status::InvalidArgument(field + ".floor' is missing or not an object");
  }
  auto grad_rel = floor->find("grad_norm_rel");
  auto loss_rel = floor->find("loss_rel");
  if (grad_rel == floor->end() || !grad_rel->is_number() || grad_rel->get<double>() < 0) {
    return Status::InvalidArgument(field + ".floor.grad_norm_rel' must be a number >= 0");
  }
  if (loss_rel == floor->end() || !loss_rel->is_array() ||
      static_cast<int64_t>(loss_rel->size()) != steps) {
    return Status::InvalidArgument(field + ".floor.loss_rel' must be a list of training.steps = " +
                                   std::to_string(steps) + " numbers");
  }
  trace.floor_grad_norm_rel = grad_rel->get<double>();
  for (const auto& l : *loss_rel) {
    if (!l.is_number()) {
      return Status::InvalidArgument(field + ".floor.loss_rel' holds " + l.dump());
    }
    trace.floor_loss_rel.push_back(l.get<double>());
  }
  if (auto impls = floor->find("implementations"); impls != floor->end() && impls->is_array()) {
    for (const auto& i : *impls) {
      if (i.is_string()) trace.floor_implementations.push_back(i.get<std::string>());
    }
  }
  return trace;
}

/// reference.json "decode_floor"."<precision>".
Result<DecodeFloor> ParseDecodeFloor(const nlohmann::json& meta, const std::string& precision,
                                     const std::string& where) {
  const std::string field = where + ": field 'decode_floor." + precision;
  auto all = meta.find("decode_floor");
  if (all == meta.end() || !all->is_object() || !all->contains(precision) ||
      !(*all)[precision].is_object()) {
    return Status::InvalidArgument(field + "' (upstream's own decode spread) is missing");
  }
  const nlohmann::json& j = (*all)[precision];
  DecodeFloor f;
  for (const auto& [name, out] : {std::pair{"max_abs_diff", &f.max_abs_diff},
                                  std::pair{"kl_mean", &f.kl_mean}}) {
    auto it = j.find(name);
    if (it == j.end() || !it->is_number() || it->get<double>() < 0) {
      return Status::InvalidArgument(field + "." + name + "' must be a number >= 0");
    }
    *out = it->get<double>();
  }
  if (auto steps = j.find("steps"); steps != j.end() && steps->is_number_integer()) {
    f.steps = steps->get<int64_t>();
  }
  return f;
}

Result<TrainingReference> ParseTraining(const nlohmann::json& meta, const std::string& where) {
  auto it = meta.find("training");
  if (it == meta.end() || !it->is_object()) {
    return Status::InvalidArgument(where + ": field 'training' (upstream's training trace) is "
                                   "missing or not an object");
  }
  TrainingReference t;
  const nlohmann::json& j = *it;
  auto steps = j.find("steps");
  auto lr = j.find("lr");
  if (steps == j.end() || !steps->is_number_integer() || steps->get<int64_t>() < 1) {
    return Status::InvalidArgument(where + ": field 'training.steps' must be a positive integer");
  }
  if (lr == j.end() || !lr->is_number() || !(lr->get<double>() > 0)) {
    return Status::InvalidArgument(where + ": field 'training.lr' must be a positive number");
  }
  t.steps = steps->get<int64_t>();
  t.lr = lr->get<double>();
  if (auto seed = j.find("seed"); seed != j.end() && seed->is_number_integer()) {
    t.seed = seed->get<int64_t>();
  }
  if (auto opt = j.find("optimizer"); opt != j.end() && opt->is_string()) {
    t.optimizer = opt->get<std::string>();
  }
  GH_ASSIGN_OR_RETURN(t.fp32, ParseTrace(j, "fp32", t.steps, where));
  GH_ASSIGN_OR_RETURN(t.bf16, ParseTrace(j, "bf16", t.steps, where));
  return t;
}

}  // namespace

Result<ReferenceBundle> LoadReference(const std::filesystem::path& dir) {
  ReferenceBundle bundle;
  bundle.dir = dir;
  if (!std::filesystem::is_directory(dir)) {
    return Status::NotFound("reference bundle " + dir.string() + " is not a directory");
  }
  const auto meta_path = dir / "reference.json";
  {
    std::ifstream in(meta_path, std::ios::binary);
    if (!in) return Status::NotFound("reference bundle lacks " + meta_path.string());
    std::stringstream buf;
    buf << in.rdbuf();
    try {
      bundle.meta = nlohmann::json::parse(buf.str());
    } catch (const nlohmann::json::parse_error& e) {
      // e.what() carries the byte position; Python's json.dumps writes NaN / Infinity, which
      // JSON does not have, for a non-finite loss or floor.
      return Status::InvalidArgument(meta_path.string() + " is not valid JSON: " + e.what());
    }
  }
  if (!bundle.meta.is_object()) {
    return Status::InvalidArgument(meta_path.string() + " is not a JSON object");
  }
  auto format = bundle.meta.find("format");
  if (format == bundle.meta.end() || !format->is_string() ||
      format->get<std::string>() != kReferenceFormat) {
    return Status::InvalidArgument(
        meta_path.string() + ": field 'format' is " +
        (format == bundle.meta.end() ? std::string("missing") : format->dump()) +
        "; expected \"" + std::string(kReferenceFormat) + "\"" +
        (format != bundle.meta.end() && *format == "gatehouse-reference/1"
             ? " (format 1 has no decode logits and no training trace; make the bundle again "
               "with tools/refgen/make_checkpoint.py)"
             : ""));
  }

  GH_ASSIGN_OR_RETURN(safetensors::File file, safetensors::File::Open(dir / "reference.safetensors"));

  int64_t count = -1;
  const auto num_prompts = bundle.meta.find("num_prompts");
  if (num_prompts != bundle.meta.end() &&
      (!num_prompts->is_number_integer() || num_prompts->get<int64_t>() < 0)) {
    return Status::InvalidArgument(meta_path.string() + ": field 'num_prompts' is " +
                                   num_prompts->dump() + "; expected a non-negative integer");
  }
  if (auto p = bundle.meta.find("prompts"); p != bundle.meta.end() && p->is_array()) {
    count = static_cast<int64_t>(p->size());
    if (num_prompts != bundle.meta.end() && num_prompts->get<int64_t>() != count) {
      return Status::InvalidArgument(meta_path.string() + ": field 'num_prompts' is " +
                                     num_prompts->dump() + " but 'prompts' lists " +
                                     std::to_string(count));
    }
  } else if (num_prompts != bundle.meta.end()) {
    count = num_prompts->get<int64_t>();
  } else {
    count = 0;
    while (file.Find("prompts." + std::to_string(count) + ".input_ids") != nullptr) ++count;
  }
  if (count == 0) {
    return Status::InvalidArgument("reference bundle " + dir.string() +
                                   " holds no prompt (no tensor 'prompts.0.input_ids')");
  }

  for (int64_t i = 0; i < count; ++i) {
    const std::string prefix = "prompts." + std::to_string(i) + ".";
    ReferencePrompt p;
    GH_ASSIGN_OR_RETURN(p.input_ids,
                        ReadChecked(file, prefix + "input_ids", safetensors::Dtype::kI64, 1));
    const int64_t t = p.input_ids.size(0);
    if (t < 1) {
      return Status::InvalidArgument("reference tensor '" + prefix + "input_ids' is empty");
    }
    GH_ASSIGN_OR_RETURN(p.fp32, ReadRun(file, prefix, "", t));
    GH_ASSIGN_OR_RETURN(p.bf16, ReadRun(file, prefix, "_bf16", t));
    for (const ReferenceRun* run : {&p.fp32, &p.bf16}) {
      const std::string suffix = run == &p.bf16 ? "_bf16" : "";
      const int64_t v = run->logits.size(1), n = run->greedy_ids.size(0);
      if (bundle.vocab_size != 0 && v != bundle.vocab_size) {
        return Status::InvalidArgument("reference tensor '" + prefix + "logits" + suffix +
                                       "' has vocabulary " + std::to_string(v) +
                                       "; 'prompts.0.logits' has " +
                                       std::to_string(bundle.vocab_size));
      }
      // One decode length for the bundle: the cell's max_new_tokens is checked against it once.
      if (bundle.max_new_tokens != 0 && n != bundle.max_new_tokens) {
        return Status::InvalidArgument("reference tensor '" + prefix + "greedy_ids" + suffix +
                                       "' has " + std::to_string(n) +
                                       " tokens; 'prompts.0.greedy_ids' has " +
                                       std::to_string(bundle.max_new_tokens));
      }
      bundle.vocab_size = v;
      bundle.max_new_tokens = n;
    }
    GH_RETURN_IF_ERROR(RequireIdsBelow(p.input_ids, bundle.vocab_size, prefix + "input_ids"));
    bundle.prompts.push_back(std::move(p));
  }
  if (auto m = bundle.meta.find("max_new_tokens");
      m != bundle.meta.end() && *m != nlohmann::json(bundle.max_new_tokens)) {
    return Status::InvalidArgument(meta_path.string() + ": field 'max_new_tokens' is " + m->dump() +
                                   " but the greedy_ids tensors hold " +
                                   std::to_string(bundle.max_new_tokens) + " tokens");
  }
  GH_ASSIGN_OR_RETURN(bundle.training, ParseTraining(bundle.meta, meta_path.string()));
  GH_ASSIGN_OR_RETURN(bundle.decode_floor_fp32,
                      ParseDecodeFloor(bundle.meta, "fp32", meta_path.string()));
  GH_ASSIGN_OR_RETURN(bundle.decode_floor_bf16,
                      ParseDecodeFloor(bundle.meta, "bf16", meta_path.string()));
  if (auto d = bundle.meta.find("device"); d != bundle.meta.end() && d->is_string()) {
    bundle.device = d->get<std::string>();
  }
  if (auto c = bundle.meta.find("cpu_capability"); c != bundle.meta.end() && c->is_string()) {
    bundle.cpu_capability = c->get<std::string>();
  }
  if (auto n = bundle.meta.find("num_threads"); n != bundle.meta.end() && n->is_number_integer()) {
    bundle.num_threads = n->get<int64_t>();
  }
  GH_ASSIGN_OR_RETURN(bundle.envelope, ParseEnvelope(bundle.meta, meta_path.string()));
  return bundle;
}

}  // namespace gatehouse::worker
