#include "decoder/rope.h"

#include <array>
#include <cmath>

namespace gatehouse::models {
namespace {

using nlohmann::json;

/// Keys a rope dict may hold, per rope_type (beyond rope_type/type/rope_theta).
bool KnownRopeKey(std::string_view key) {
  static constexpr std::array<std::string_view, 8> kKeys = {
      "rope_type",       "type",           "rope_theta",
      "factor",          "low_freq_factor", "high_freq_factor",
      "original_max_position_embeddings", "partial_rotary_factor"};
  for (auto k : kKeys) {
    if (k == key) return true;
  }
  return false;
}

Result<double> RequiredNested(const json& dict, std::string_view prefix, std::string_view key,
                              std::string_view rope_type) {
  GH_ASSIGN_OR_RETURN(auto v, NestedNumber(dict, prefix, key));
  if (!v.has_value()) {
    return Status::InvalidArgument("config field '" + std::string(prefix) + std::string(key) +
                                   "' is required for rope_type \"" + std::string(rope_type) +
                                   "\" but missing");
  }
  return *v;
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

json RopeConfig::ToJson() const {
  json j{{"rope_type", rope_type},
         {"rope_theta", rope_theta},
         {"rope_theta_source", rope_theta_source},
         {"partial_rotary_factor", partial_rotary_factor}};
  if (rope_type != "default") j["factor"] = factor;
  if (rope_type == "llama3") {
    j["low_freq_factor"] = low_freq_factor;
    j["high_freq_factor"] = high_freq_factor;
    j["original_max_position_embeddings"] = original_max_position_embeddings;
  }
  return j;
}

Result<RopeConfig> ParseRopeDict(ConfigReader& reader, const json& dict, std::string_view prefix,
                                 double theta_fallback, std::string_view theta_source) {
  if (!dict.is_object()) {
    std::string field(prefix);
    if (!field.empty() && field.back() == '.') field.pop_back();
    return FieldError(field, dict, "expected an object");
  }
  for (const auto& [key, value] : dict.items()) {
    if (!KnownRopeKey(key)) reader.AddUnmapped(std::string(prefix) + key);
  }
  RopeConfig rope;
  GH_ASSIGN_OR_RETURN(auto type, NestedString(dict, prefix, "rope_type"));
  GH_ASSIGN_OR_RETURN(auto legacy_type, NestedString(dict, prefix, "type"));
  rope.rope_type = type.value_or(legacy_type.value_or("default"));
  const std::string type_key =
      std::string(prefix) + (type.has_value() || !legacy_type.has_value() ? "rope_type" : "type");
  if (rope.rope_type != "default" && rope.rope_type != "linear" && rope.rope_type != "dynamic" &&
      rope.rope_type != "llama3") {
    return FieldError(type_key, json(rope.rope_type),
                      "unsupported RoPE type (implemented: \"default\", \"linear\", \"dynamic\", "
                      "\"llama3\")");
  }
  GH_ASSIGN_OR_RETURN(auto theta, NestedNumber(dict, prefix, "rope_theta"));
  rope.rope_theta = theta.value_or(theta_fallback);
  rope.rope_theta_source = theta.has_value() ? std::string(prefix) + "rope_theta"
                                             : std::string(theta_source);
  GH_ASSIGN_OR_RETURN(auto prf, NestedNumber(dict, prefix, "partial_rotary_factor"));
  rope.partial_rotary_factor = prf.value_or(1.0);
  if (rope.rope_type != "default") {
    GH_ASSIGN_OR_RETURN(rope.factor, RequiredNested(dict, prefix, "factor", rope.rope_type));
    if (!(rope.factor >= 1.0)) {
      return FieldError(std::string(prefix) + "factor", json(rope.factor), "must be >= 1");
    }
  }
  if (rope.rope_type == "llama3") {
    GH_ASSIGN_OR_RETURN(rope.low_freq_factor,
                        RequiredNested(dict, prefix, "low_freq_factor", rope.rope_type));
    GH_ASSIGN_OR_RETURN(rope.high_freq_factor,
                        RequiredNested(dict, prefix, "high_freq_factor", rope.rope_type));
    GH_ASSIGN_OR_RETURN(auto omp, NestedInt(dict, prefix, "original_max_position_embeddings"));
    if (!omp.has_value() || *omp <= 0) {
      return Status::InvalidArgument("config field '" + std::string(prefix) +
                                     "original_max_position_embeddings' is required (positive) "
                                     "for rope_type \"llama3\"");
    }
    rope.original_max_position_embeddings = *omp;
    if (!(rope.high_freq_factor > rope.low_freq_factor)) {
      return FieldError(std::string(prefix) + "high_freq_factor", json(rope.high_freq_factor),
                        "must exceed low_freq_factor");
    }
  }
  if (!(rope.rope_theta > 0)) {
    return FieldError(std::string(prefix) + "rope_theta", json(rope.rope_theta),
                      "must be positive");
  }
  if (!(rope.partial_rotary_factor > 0 && rope.partial_rotary_factor <= 1)) {
    return FieldError(std::string(prefix) + "partial_rotary_factor",
                      json(rope.partial_rotary_factor), "must be in (0, 1]");
  }
  return rope;
}

Result<RopeConfig> ParseRope(ConfigReader& reader, double default_theta) {
  const json* params = reader.Raw("rope_parameters");
  const json* scaling = reader.Raw("rope_scaling");
  if (params != nullptr && scaling != nullptr && *params != *scaling) {
    return Status::InvalidArgument(
        "config fields 'rope_parameters' = " + params->dump() + " and 'rope_scaling' = " +
        scaling->dump() + " disagree; transformers 5 reads only one of them");
  }
  GH_ASSIGN_OR_RETURN(auto top_theta, reader.OptionalNumber("rope_theta"));
  GH_ASSIGN_OR_RETURN(auto top_prf, reader.OptionalNumber("partial_rotary_factor"));
  const double theta = top_theta.value_or(default_theta);
  const std::string_view source = top_theta.has_value() ? "rope_theta" : "default";
  const json* dict = params != nullptr ? params : scaling;
  RopeConfig rope;
  if (dict == nullptr) {
    rope.rope_theta = theta;
    rope.rope_theta_source = std::string(source);
    if (!(rope.rope_theta > 0)) {
      return FieldError("rope_theta", json(rope.rope_theta), "must be positive");
    }
  } else {
    GH_ASSIGN_OR_RETURN(rope, ParseRopeDict(reader, *dict,
                                            params != nullptr ? "rope_parameters."
                                                              : "rope_scaling.",
                                            theta, source));
  }
  if (top_prf.has_value() && (dict == nullptr || !dict->contains("partial_rotary_factor"))) {
    rope.partial_rotary_factor = *top_prf;
    if (!(rope.partial_rotary_factor > 0 && rope.partial_rotary_factor <= 1)) {
      return FieldError("partial_rotary_factor", json(*top_prf), "must be in (0, 1]");
    }
  }
  return rope;
}

Status FullRotaryAsUpstream(RopeConfig& rope) {
  if (rope.partial_rotary_factor == 1.0) return Status::Ok();
  if (rope.rope_type == "default") {
    rope.partial_rotary_factor = 1.0;
    return Status::Ok();
  }
  return FieldError("partial_rotary_factor", json(rope.partial_rotary_factor),
                    "with rope_type \"" + rope.rope_type +
                        "\" upstream rotates only part of head_dim but applies it to all of "
                        "head_dim, which fails (apply_rotary_pos_emb cannot broadcast): a config "
                        "upstream cannot run");
}

int64_t RotaryDim(const RopeConfig& rope, int64_t head_dim) {
  return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
}

torch::Tensor RopeInverseFrequencies(const RopeConfig& rope, int64_t head_dim,
                                     int64_t max_position_embeddings, int64_t seq_len,
                                     torch::Device device) {
  // Operation order follows modeling_rope_utils.py op for op, including Python's
  // `scalar / tensor`, which torch evaluates as tensor.reciprocal() * scalar (two roundings,
  // not one division): a single-ulp difference in one frequency moves bf16 logits.
  const int64_t dim = RotaryDim(rope, head_dim);
  const auto exponent =
      torch::arange(0, dim, 2, torch::TensorOptions().dtype(torch::kLong).device(device))
          .to(torch::kFloat32) /
      static_cast<double>(dim);
  torch::Tensor inv_freq;
  if (rope.rope_type == "dynamic" && seq_len > max_position_embeddings) {
    // _compute_dynamic_ntk_parameters with seq_len = torch.max(position_ids) + 1, a 0-d int64
    // tensor (dynamic_rope_update): the grown base is computed in fp32 tensor arithmetic.
    // Up to max_position_embeddings upstream keeps the init-time frequencies (plain base).
    const auto len = torch::scalar_tensor(seq_len, torch::TensorOptions().dtype(torch::kLong));
    auto base = torch::pow(len * rope.factor / max_position_embeddings - (rope.factor - 1.0),
                           static_cast<double>(dim) / static_cast<double>(dim - 2)) *
                rope.rope_theta;
    inv_freq = torch::pow(base.to(device), exponent).reciprocal();
  } else {
    inv_freq = torch::pow(rope.rope_theta, exponent).reciprocal();
  }
  if (rope.rope_type == "linear") {
    inv_freq = inv_freq / rope.factor;
  } else if (rope.rope_type == "llama3") {
    // _compute_llama3_parameters: keep high frequencies, divide low ones by factor, and
    // interpolate smoothly in between.
    const double old_context = static_cast<double>(rope.original_max_position_embeddings);
    const double low_freq_wavelen = old_context / rope.low_freq_factor;
    const double high_freq_wavelen = old_context / rope.high_freq_factor;
    auto wavelen = inv_freq.reciprocal() * (2 * M_PI);  // 2 * math.pi / inv_freq
    auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq);
    auto smooth = (wavelen.reciprocal() * old_context - rope.low_freq_factor) /
                  (rope.high_freq_factor - rope.low_freq_factor);
    auto smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
    auto is_medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
    inv_freq = torch::where(is_medium, smoothed, scaled);
  }
  return inv_freq;
}

RotaryTables RopeTables(const torch::Tensor& positions, const torch::Tensor& inv_freq,
                        torch::Dtype dtype) {
  auto freqs = positions.unsqueeze(-1).to(torch::kFloat32) * inv_freq;  // [B, T, D/2]
  auto emb = torch::cat({freqs, freqs}, -1);                             // [B, T, D]
  return RotaryTables{emb.cos().to(dtype), emb.sin().to(dtype)};
}

torch::Tensor ApplyRotary(const torch::Tensor& x, const RotaryTables& rope) {
  auto cos = rope.cos.unsqueeze(1);  // [B, 1, T, rotary_dim]: broadcast over heads
  auto sin = rope.sin.unsqueeze(1);
  const int64_t rotary_dim = cos.size(-1);
  if (rotary_dim == x.size(-1)) return x * cos + RotateHalf(x) * sin;
  auto x_rot = x.narrow(-1, 0, rotary_dim);
  auto x_pass = x.narrow(-1, rotary_dim, x.size(-1) - rotary_dim);
  return torch::cat({x_rot * cos + RotateHalf(x_rot) * sin, x_pass}, -1);
}

}  // namespace gatehouse::models
