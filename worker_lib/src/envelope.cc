// reference.json "envelope" (envelope.h; written by tools/refgen/envelope.py).
#include "gatehouse/worker/envelope.h"

#include <algorithm>

namespace gatehouse::worker {
namespace {

/// `obj`.`name` as a number >= 0 (and <= `max`), into `out`; `field` names obj in errors.
Status ReadFigure(const nlohmann::json& obj, const char* name, const std::string& field,
                  double& out, double max = 1e300) {
  auto it = obj.find(name);
  if (it == obj.end() || !it->is_number() || !(it->get<double>() >= 0) ||
      !(it->get<double>() <= max)) {
    return Status::InvalidArgument(field + "." + name + "' is " +
                                   (it == obj.end() ? std::string("missing") : it->dump()) +
                                   "; expected a number in [0, " +
                                   (max < 1e300 ? std::to_string(static_cast<int>(max)) : "inf") +
                                   "]");
  }
  out = it->get<double>();
  return Status::Ok();
}

std::string TextOr(const nlohmann::json& obj, const char* name) {
  auto it = obj.find(name);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

Result<LogitEnvelope> ParseLogits(const nlohmann::json& precision, const char* section,
                                  const std::string& field) {
  const std::string f = field + "." + section;
  auto it = precision.find(section);
  if (it == precision.end() || !it->is_object()) {
    return Status::InvalidArgument(f + "' is missing or not an object");
  }
  LogitEnvelope e;
  GH_RETURN_IF_ERROR(ReadFigure(*it, "max_abs_diff", f, e.max_abs_diff));
  GH_RETURN_IF_ERROR(ReadFigure(*it, "kl_mean", f, e.kl_mean));
  GH_RETURN_IF_ERROR(ReadFigure(*it, "top1_percent", f, e.top1_percent, 100));
  e.max_abs_diff_from = TextOr(*it, "max_abs_diff_from");
  e.kl_mean_from = TextOr(*it, "kl_mean_from");
  e.top1_percent_from = TextOr(*it, "top1_percent_from");
  return e;
}

Result<TrainingEnvelope> ParseTraining(const nlohmann::json& precision, const std::string& field) {
  const std::string f = field + ".training";
  auto it = precision.find("training");
  if (it == precision.end() || !it->is_object()) {
    return Status::InvalidArgument(f + "' is missing or not an object");
  }
  TrainingEnvelope e;
  GH_RETURN_IF_ERROR(ReadFigure(*it, "first_loss_rel", f, e.first_loss_rel));
  GH_RETURN_IF_ERROR(ReadFigure(*it, "grad_norm_rel", f, e.grad_norm_rel));
  GH_RETURN_IF_ERROR(ReadFigure(*it, "grad_sum_rel", f, e.grad_sum_rel));
  auto losses = it->find("loss_rel");
  if (losses == it->end() || !losses->is_array() || losses->empty()) {
    return Status::InvalidArgument(f + ".loss_rel' must be a non-empty list of numbers >= 0");
  }
  for (const auto& l : *losses) {
    if (!l.is_number() || !(l.get<double>() >= 0)) {
      return Status::InvalidArgument(f + ".loss_rel' holds " + l.dump() +
                                     "; expected numbers >= 0");
    }
    e.loss_rel.push_back(l.get<double>());
  }
  e.grad_norm_rel_from = TextOr(*it, "grad_norm_rel_from");
  e.grad_sum_rel_from = TextOr(*it, "grad_sum_rel_from");
  return e;
}

/// precision.`name` as an object, or null when absent (a version 1 envelope); `f` becomes
/// its field name for errors. Error: present but not an object.
Result<const nlohmann::json*> OptionalSection(const nlohmann::json& precision, const char* name,
                                              const std::string& field, std::string& f) {
  auto it = precision.find(name);
  if (it == precision.end()) return static_cast<const nlohmann::json*>(nullptr);
  f = field + "." + name;
  if (!it->is_object()) return Status::InvalidArgument(f + "' is not an object");
  return &*it;
}

Result<std::optional<LogprobEnvelope>> ParseLogprobs(const nlohmann::json& precision,
                                                     const std::string& field) {
  std::string f;
  GH_ASSIGN_OR_RETURN(const nlohmann::json* s, OptionalSection(precision, "logprobs", field, f));
  if (s == nullptr) return std::optional<LogprobEnvelope>();
  LogprobEnvelope e;
  GH_RETURN_IF_ERROR(ReadFigure(*s, "mean_abs_diff", f, e.mean_abs_diff));
  GH_RETURN_IF_ERROR(ReadFigure(*s, "max_abs_diff", f, e.max_abs_diff));
  e.mean_abs_diff_from = TextOr(*s, "mean_abs_diff_from");
  e.max_abs_diff_from = TextOr(*s, "max_abs_diff_from");
  return std::optional<LogprobEnvelope>(std::move(e));
}

Result<std::optional<PackingEnvelope>> ParsePacking(const nlohmann::json& precision,
                                                    const std::string& field) {
  std::string f;
  GH_ASSIGN_OR_RETURN(const nlohmann::json* s, OptionalSection(precision, "packing", field, f));
  if (s == nullptr) return std::optional<PackingEnvelope>();
  PackingEnvelope e;
  GH_RETURN_IF_ERROR(ReadFigure(*s, "kl_max", f, e.kl_max));
  GH_RETURN_IF_ERROR(ReadFigure(*s, "loss_rel", f, e.loss_rel));
  GH_RETURN_IF_ERROR(ReadFigure(*s, "grad_rel", f, e.grad_rel));
  e.kl_max_from = TextOr(*s, "kl_max_from");
  e.loss_rel_from = TextOr(*s, "loss_rel_from");
  e.grad_rel_from = TextOr(*s, "grad_rel_from");
  return std::optional<PackingEnvelope>(std::move(e));
}

}  // namespace

double TrainingEnvelope::LossRelThrough(int64_t steps) const {
  double worst = 0;
  for (size_t i = 0; i < loss_rel.size() && (steps <= 0 || static_cast<int64_t>(i) < steps); ++i) {
    worst = std::max(worst, loss_rel[i]);
  }
  // Steps past the envelope's trace get its largest: a loss spread grows with the steps.
  if (steps > static_cast<int64_t>(loss_rel.size())) {
    for (double l : loss_rel) worst = std::max(worst, l);
  }
  return worst;
}

std::string Envelope::Describe() const {
  std::string names;
  for (const std::string& v : variations) names += (names.empty() ? "" : ", ") + v;
  return std::to_string(variations.size()) + " variation(s) of upstream (" + names + ")";
}

Result<Envelopes> ParseEnvelope(const nlohmann::json& meta, const std::string& where) {
  Envelopes out;
  auto env = meta.find("envelope");
  if (env == meta.end()) return out;
  const std::string field = where + ": field 'envelope";
  if (!env->is_object()) return Status::InvalidArgument(field + "' is not an object");
  std::vector<std::string> variations;
  if (auto v = env->find("variations"); v != env->end()) {
    if (!v->is_array()) return Status::InvalidArgument(field + ".variations' is not a list");
    for (const auto& name : *v) {
      if (!name.is_string()) {
        return Status::InvalidArgument(field + ".variations' holds " + name.dump());
      }
      variations.push_back(name.get<std::string>());
    }
  }
  for (const char* precision : {"fp32", "bf16"}) {
    auto p = env->find(precision);
    if (p == env->end()) continue;
    const std::string f = field + "." + precision;
    if (!p->is_object()) return Status::InvalidArgument(f + "' is not an object");
    Envelope e;
    GH_ASSIGN_OR_RETURN(e.prompt, ParseLogits(*p, "prompt", f));
    GH_ASSIGN_OR_RETURN(e.decode_steps, ParseLogits(*p, "decode_steps", f));
    GH_ASSIGN_OR_RETURN(e.training, ParseTraining(*p, f));
    GH_ASSIGN_OR_RETURN(e.logprobs, ParseLogprobs(*p, f));
    GH_ASSIGN_OR_RETURN(e.packing, ParsePacking(*p, f));
    e.variations = variations;
    (std::string_view(precision) == "bf16" ? out.bf16 : out.fp32) = std::move(e);
  }
  return out;
}

}  // namespace gatehouse::worker
