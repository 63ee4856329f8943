// The Gemma family (HF model_type "gemma"), and the config pieces Gemma 2 and Gemma 3 share.
//
// Semantics follow transformers 5.24 models/gemma/configuration_gemma.py (GemmaConfig) and
// modeling_gemma.py:
//   GemmaRMSNorm                 x * (1 + w), computed in fp32, then cast (NormKind::kGemma);
//   GemmaTextScaledWordEmbedding embeddings * sqrt(hidden_size), the scale first cast to the
//                                weight dtype (DecoderSpec::scale_embeddings);
//   GemmaMLP                     down(gelu_tanh(gate x) * up x), activation from hidden_act
//                                (GemmaConfig.__post_init__ turns the legacy "gelu" into
//                                "gelu_pytorch_tanh");
//   GemmaAttention               scaling head_dim^-0.5, optional attention_bias on q/k/v/o;
//   GemmaRotaryEmbedding         RoPE over the whole head_dim (partial_rotary_factor unused);
//   GemmaForCausalLM             lm_head tied to the embedding unless tie_word_embeddings=false.
// head_dim and num_key_value_heads default to model-size constants upstream (256, 16), not to
// values derived from other fields, so they are required here (save_pretrained writes both).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "decoder/config_reader.h"
#include "decoder/model.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models::gemma {

/// Maps a transformers-saved GemmaConfig to a DecoderSpec. Errors: INVALID_ARGUMENT naming the
/// field (and value) for a missing required field (including head_dim and
/// num_key_value_heads), a wrong JSON type, hidden_act other than "gelu_pytorch_tanh" / "gelu",
/// a hidden_activation (the 4.x field) other than "gelu_pytorch_tanh",
/// use_bidirectional_attention true, partial_rotary_factor other than 1, or an unsupported
/// rope type.
Result<DecoderSpec> ParseGemmaConfig(ConfigReader& reader);

/// The registration record: family "gemma", model_type "gemma".
std::unique_ptr<worker::ModelFamily> MakeGemmaFamily();

// --- Shared by the gemma, gemma2 and gemma3 parsers ------------------------------------------

/// INVALID_ARGUMENT (MissingField) unless `field` is present and not null.
Status RequirePresent(ConfigReader& reader, std::string_view field);

/// A soft-capping field: `absent_default` when the field is absent (the config class default),
/// no capping when it is null, else its value. Errors: INVALID_ARGUMENT for a non-number.
Result<std::optional<double>> ReadSoftcap(ConfigReader& reader, std::string_view field,
                                          std::optional<double> absent_default);

/// use_bidirectional_attention must be absent, null or false. True asks for non-causal attention
/// (how much of it upstream applies depends on the attention implementation; Gemma 3 also
/// halves sliding_window), which the decoder does not implement. Errors: INVALID_ARGUMENT.
Status RejectBidirectional(ConfigReader& reader);

/// `rope` must rotate the whole head_dim: Gemma*RotaryEmbedding's default inverse frequencies
/// ignore partial_rotary_factor while the scaled rope types honour it, so a factor other than 1
/// has no single upstream meaning. `field` names where the factor came from.
/// Errors: INVALID_ARGUMENT naming `field` and the value.
Status RequireFullRotary(const RopeConfig& rope, std::string_view field);

/// What Gemma 2 and Gemma 3 text share: num_key_value_heads and head_dim required, tied by
/// default, GELU(tanh) from hidden_activation (hidden_act ignored: `mlp_class` names the upstream
/// MLP that never reads it), cache_implementation ignored, (1 + w) norms, scaled embeddings,
/// sandwich norms, attention_bias on q/k/v/o, use_bidirectional_attention rejected,
/// query_pre_attn_scalar. Errors: INVALID_ARGUMENT naming the field.
Status ParseGemma2StyleCore(ConfigReader& reader, std::string_view mlp_class, DecoderSpec& spec);

/// query_pre_attn_scalar (Gemma 2/3): attention_scaling = query_pre_attn_scalar^-0.5, default
/// 256. Errors: INVALID_ARGUMENT for a non-number or a value <= 0.
Status ReadQueryPreAttnScalar(ConfigReader& reader, DecoderSpec& spec);

/// Applies layer types to spec.layers: "sliding_attention" layers get sliding_window (default
/// 4096 when the field is absent, as Gemma2Config/Gemma3TextConfig) and RoPE `sliding_rope`,
/// "full_attention" layers RoPE `full_rope`. Errors: INVALID_ARGUMENT when a sliding layer
/// exists but sliding_window is null or not positive (upstream's mask builder raises).
Status ApplyLayerTypes(ConfigReader& reader, const std::vector<std::string>& types, int full_rope,
                       int sliding_rope, DecoderSpec& spec);

}  // namespace gatehouse::models::gemma
