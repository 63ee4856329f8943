// Rotary position embedding (RoPE): the parameters as transformers 5 standardises them, and the
// inverse frequencies of each supported rope_type.
//
// Semantics: transformers modeling_rope_utils.py (5.x): RotaryEmbeddingConfigMixin
// (rope_parameters / legacy rope_scaling + rope_theta), _compute_default_rope_parameters,
// _compute_linear_scaling_rope_parameters, _compute_dynamic_ntk_parameters,
// _compute_llama3_parameters, and dynamic_rope_update.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "decoder/config_reader.h"
#include "common/status.h"

namespace gatehouse::models {

/// One RoPE setting. rope_type is one of "default", "linear", "dynamic", "llama3"; the others
/// (yarn, longrope, ...) are rejected at parse time so they can never run silently as default.
struct RopeConfig {
  std::string rope_type = "default";
  /// Base of the frequencies.
  double rope_theta = 10000.0;
  /// Where rope_theta came from ("rope_parameters.rope_theta", "rope_theta", "default", ...).
  std::string rope_theta_source = "default";
  /// linear / dynamic / llama3 scaling factor.
  double factor = 1.0;
  /// llama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  /// Fraction of head_dim that is rotated (the rest passes through), e.g. 0.5 for some Phi-3.
  double partial_rotary_factor = 1.0;

  nlohmann::json ToJson() const;
};

/// Parses one rope dict (rope_parameters, a legacy rope_scaling, or a per-layer-type entry of
/// Gemma 3's rope_parameters). `prefix` names the dict in errors and unmapped keys
/// ("rope_parameters."); `theta_fallback`/`theta_source` apply when the dict has no rope_theta.
/// Unknown keys go to reader.AddUnmapped(prefix + key).
/// Errors: INVALID_ARGUMENT naming the key for a wrong type, an unsupported rope_type, or a
/// missing parameter of the rope_type (factor, low_freq_factor, ...).
Result<RopeConfig> ParseRopeDict(ConfigReader& reader, const nlohmann::json& dict,
                                 std::string_view prefix, double theta_fallback,
                                 std::string_view theta_source);

/// The model-wide RoPE setting of a config: rope_parameters (what transformers 5 writes), else
/// the legacy rope_scaling (with the top-level rope_theta), else plain RoPE with the top-level
/// rope_theta or `default_theta`. Both present and different -> INVALID_ARGUMENT.
/// Also reads a top-level partial_rotary_factor when present.
Result<RopeConfig> ParseRope(ConfigReader& reader, double default_theta);

/// partial_rotary_factor as the families whose modeling file computes default RoPE itself
/// treat it (llama, mistral, qwen2, qwen3, qwen3_moe in transformers 5: their
/// compute_default_rope_parameters reads head_dim only): with rope_type "default" it is ignored
/// and the whole head_dim rotates (sets the factor to 1); a scaled type honours it in
/// ROPE_INIT_FUNCTIONS, making cos/sin narrower than head_dim, which those files'
/// apply_rotary_pos_emb cannot broadcast, so a factor other than 1 there is INVALID_ARGUMENT
/// (upstream cannot run the config). Phi-3 rotates partially and does not call this.
Status FullRotaryAsUpstream(RopeConfig& rope);

/// The rotated dimension: int(head_dim * partial_rotary_factor), as upstream.
int64_t RotaryDim(const RopeConfig& rope, int64_t head_dim);

/// inv_freq [rotary_dim / 2] fp32 for a forward pass whose largest position is
/// `seq_len - 1`. Only "dynamic" depends on seq_len (NTK base growth above
/// max_position_embeddings, recomputed per call: the stateless form of upstream's
/// dynamic_rope_update for calls of non-decreasing length, which is how the gates call it).
torch::Tensor RopeInverseFrequencies(const RopeConfig& rope, int64_t head_dim,
                                     int64_t max_position_embeddings, int64_t seq_len,
                                     torch::Device device);

/// cos/sin tables of one forward pass, [B, T, rotary_dim], in the model dtype (computed in fp32
/// then cast, as upstream's rotary embedding forward).
struct RotaryTables {
  torch::Tensor cos;
  torch::Tensor sin;
};

/// positions [B, T] int64 times inv_freq, duplicated to [B, T, rotary_dim].
RotaryTables RopeTables(const torch::Tensor& positions, const torch::Tensor& inv_freq,
                        torch::Dtype dtype);

/// apply_rotary_pos_emb on x [B, H, T, head_dim]: the first rotary_dim channels become
/// x * cos + rotate_half(x) * sin, the rest pass through (partial rotary).
torch::Tensor ApplyRotary(const torch::Tensor& x, const RotaryTables& rope);

}  // namespace gatehouse::models
