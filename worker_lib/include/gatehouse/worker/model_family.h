// The model-family plugin contract: what an adaptation implements, and what the gates call.
//
// Families live in a shared-library plugin built against the worker SDK (in this repository:
// models/, a config parser per family over one shared decoder; models/README.md). The worker
// loads the plugin with dlopen and calls gatehouse_plugin_register(), which adds the plugin's
// families to the registry.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "gatehouse/worker/kv_cache.h"
#include "gatehouse/worker/state_dict_adapter.h"
#include "gatehouse/worker/tensor_parallel.h"

namespace gatehouse::worker {

/// Bump when any type in this header or the SDK headers it includes changes layout; the worker
/// refuses other versions. 2: TensorNameRule::num_experts and the stacked-slice lookups of
/// StateDictAdapter (state_dict_adapter.h). 3: ModelFamily::Parallelize / ConstructParallel
/// and the tensor-parallel types (tensor_parallel.h); CausalLM::SupportsStaticDecode /
/// DecodeStep and KVCache::WriteAt (CUDA-graph decode). 5: CausalLM::SupportsPacked /
/// ForwardPacked (packed batches). 6: ModelFamily::MapsWeightsByCode / FromHf / ToHf (families
/// whose weights are mapped by code: the Python lane), CausalLM::CachesKeysAndValues. 7:
/// ModelFamily::ShardsLoadedModel / ShardLoaded and CausalLM::FullTensors (tensor parallelism
/// by the adapter's own code: the Python lane's parallelize). 8: ModelFamily::
/// ConstructExpertParallel, ExpertParallel and TpCommunicator::AllToAll (tensor_parallel.h),
/// CausalLM::ExpertTokenCounts / ExpertNearTies. 9: CausalLM::SupportsContextParallel /
/// ForwardPackedContextParallel and ContextParallel (tensor_parallel.h). 10: ShardLoaded takes
/// the rank's place in the world (tp inside data parallelism, the family's own data
/// parallelism), CausalLM::FullOfLocal / LocalGradients / ReducesDataParallelGradients. 11:
/// ShardLoaded takes the world's ExpertGroups (tensor_parallel.h: the adapter's own expert
/// parallelism), CausalLM::ClippingGradNorm.
inline constexpr int kPluginAbiVersion = 11;

/// Named tensors in a given order (checkpoint keys or parameter names).
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// How each top-level field of config.json was treated. Every field must land in `mapped` or
/// `ignored`; a field the family cannot honour makes ParseConfig fail instead.
struct ConfigReport {
  std::vector<std::string> mapped;
  /// (field, reason it does not change the computation), e.g. ("use_cache", "runtime flag").
  std::vector<std::pair<std::string, std::string>> ignored;
  /// Fields of config.json that the family neither mapped nor ignored. Must be empty to PASS.
  std::vector<std::string> unmapped;
};

/// Family-specific hyper-parameters, opaque to the gates except for these accessors.
class ModelArgs {
 public:
  virtual ~ModelArgs() = default;
  /// All args as JSON, for the evidence (e.g. {"hidden_size": 64, ...}).
  virtual nlohmann::json ToJson() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t num_hidden_layers() const = 0;
  virtual int64_t num_key_value_heads() const = 0;
  virtual int64_t head_dim() const = 0;
  virtual int64_t max_position_embeddings() const = 0;
  virtual bool tie_word_embeddings() const = 0;
  /// The smallest sliding window of any layer, in tokens (a query attends to the last
  /// `sliding_window` positions, itself included, as transformers' sliding_window); 0 when no
  /// layer slides. The decode gates use it: past the window, upstream's sliding KV cache keeps
  /// only the window's keys, so its attention sums run over other lengths than a masked one.
  virtual int64_t min_sliding_window() const { return 0; }
};

/// A causal language model built by a family. Parameters are registered under the family's
/// internal names (the right-hand side of its name table).
class CausalLM : public torch::nn::Module {
 public:
  /// tokens: [B, T] int64 token ids; positions: [B, T] int64 absolute positions.
  /// cache: when non-null, the keys/values of these T positions are appended to it (it must
  /// hold exactly the positions before them) and attention covers the cached prefix too; the
  /// model calls cache->Advance(T) at the end. Returns logits [B, T, vocab_size] in the model's
  /// dtype. Causal masking is applied within the new positions.
  virtual torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& positions,
                                KVCache* cache) = 0;
  /// A cache sized for this model: batch x max_len positions, in the model's dtype and device.
  virtual std::unique_ptr<KVCache> NewKVCache(int64_t batch, int64_t max_len) const = 0;
  /// False when Forward with a cache recomputes the whole sequence instead of attending over
  /// cached keys and values (the Python lane: Archon's forward has no cache). Its decode steps
  /// are then teacher-forced forwards, and the decode gate holds them to upstream's
  /// teacher-forced logits first. Default true.
  virtual bool CachesKeysAndValues() const { return true; }

  /// True when DecodeStep is implemented for this model (CUDA-graph decode). Default false.
  virtual bool SupportsStaticDecode() const { return false; }
  /// One greedy-decode step with static shapes, capturable in a CUDA graph (cuda_graph.h):
  /// tokens [B, 1] int64 and positions [B, 1] int64 on the model's device. Writes row b's new
  /// keys and values into slot positions[b] of `cache` (KVCache::WriteAt), attends over the
  /// slots s <= positions[b] (and inside a sliding window), and reads nothing back to the host.
  /// Returns logits [B, 1, vocab_size]. Default: throws c10::Error (not supported).
  virtual torch::Tensor DecodeStep(const torch::Tensor& tokens, const torch::Tensor& positions,
                                   KVCache& cache) {
    (void)tokens;
    (void)positions;
    (void)cache;
    TORCH_CHECK(false, "this model has no static decode step (SupportsStaticDecode is false)");
  }
  /// True when ForwardPacked is implemented for this model. Default false.
  virtual bool SupportsPacked() const { return false; }
  /// A packed forward, as RL and SFT trainers run one (flash-attention's varlen convention):
  /// tokens [1, T] int64 hold S sequences back to back, sequence s in columns
  /// [cu_seqlens[s], cu_seqlens[s + 1]); cu_seqlens [S + 1] int64 on the model's device, 0
  /// first, non-decreasing, T last; positions [1, T] int64 as the caller gives them (a trainer
  /// restarts them at 0 for each sequence). No attention crosses a sequence boundary: each
  /// sequence's logits are those of its own forward. No cache. Returns logits [1, T,
  /// vocab_size]. Default: throws c10::Error (not supported).
  virtual torch::Tensor ForwardPacked(const torch::Tensor& tokens, const torch::Tensor& positions,
                                      const torch::Tensor& cu_seqlens) {
    (void)tokens;
    (void)positions;
    (void)cu_seqlens;
    TORCH_CHECK(false, "this model has no packed forward (SupportsPacked is false)");
  }
  /// True when ForwardPackedContextParallel is implemented for this model. Default false.
  virtual bool SupportsContextParallel() const { return false; }
  /// ForwardPacked with the packed sequence split over a context-parallel group (Ulysses):
  /// `tokens` and `positions` [1, T / cp.size] int64 are this rank's columns of the packing
  /// (rank r holds [r T / size, (r + 1) T / size)), the positions those of the whole packing
  /// (a sequence that began on an earlier rank goes on counting); `cu_seqlens` [S + 1] int64
  /// bounds the whole packing (0 first, T last). Attention sees the whole sequence; every
  /// other layer sees this rank's columns. Returns logits [1, T / cp.size, vocab_size] of this
  /// rank's columns: those columns of ForwardPacked's on the whole packing. A collective over
  /// cp.comm; gradients of the parameters are this rank's columns' share (a trainer sums them
  /// over the cp group). Default: throws c10::Error (not supported).
  virtual torch::Tensor ForwardPackedContextParallel(const torch::Tensor& tokens,
                                                     const torch::Tensor& positions,
                                                     const torch::Tensor& cu_seqlens,
                                                     const ContextParallel& cp) {
    (void)tokens;
    (void)positions;
    (void)cu_seqlens;
    TORCH_CHECK(false, "this model has no context-parallel forward (SupportsContextParallel is "
                "false); asked for cp=", cp.size);
  }
  /// True when ForwardStage is implemented for this model (pipeline parallelism). Default false.
  virtual bool SupportsStages() const { return false; }
  /// The forward of one pipeline stage: the decoder layers [first_layer, end_layer) alone, no
  /// cache. `input` is token ids [B, T] int64 when first_layer is 0 (embedded first), else the
  /// previous stage's hidden states [B, T, hidden_size] in the model dtype; positions [B, T]
  /// int64. Returns hidden states [B, T, hidden_size] after the last layer of the range, or
  /// logits [B, T, vocab_size] when end_layer is num_hidden_layers (the final norm and the head
  /// applied). The stages in order compose to Forward. Default: throws c10::Error.
  virtual torch::Tensor ForwardStage(const torch::Tensor& input, const torch::Tensor& positions,
                                     int64_t first_layer, int64_t end_layer) {
    (void)input;
    (void)positions;
    TORCH_CHECK(false, "this model does not run in stages (SupportsStages is false); asked for "
                "layers [", first_layer, ", ", end_layer, ")");
  }
  /// Tokens this rank routed to each expert of each MoE layer since construction or the last
  /// ResetExpertTokenCounts (each token counted once per expert it chose; under expert
  /// parallelism counted where it was routed, not where its expert ran): [moe_layers,
  /// num_experts] int64 on the CPU. An undefined tensor for a model without experts (the
  /// default).
  virtual torch::Tensor ExpertTokenCounts() const { return {}; }
  /// Of the tokens ExpertTokenCounts counts, those whose router logits for their k-th and
  /// (k+1)-th choices lie within 2 units in the last place of the logits' dtype (ties
  /// included), summed over the MoE layers: a rounding difference upstream of the router (a
  /// sharded layout in bf16) may swap those two choices. 0 without experts (the default).
  virtual int64_t ExpertNearTies() const { return 0; }
  /// Zeroes ExpertTokenCounts and ExpertNearTies.
  virtual void ResetExpertTokenCounts() {}
  /// Every parameter in full (gradients false) or its gradient in full (gradients true; zeros
  /// where a parameter has none), detached, in named_parameters order with a tied weight once,
  /// under its first name. For a model that ModelFamily::ShardLoaded sharded this gathers the
  /// shards (DTensor full_tensor): a collective that every rank calls in the same order. Errors:
  /// INTERNAL with the cause when gathering fails. Default: FAILED_PRECONDITION (the gates read a
  /// model of their own plan through named_parameters and TpPlan::Unshard).
  virtual Result<NamedTensors> FullTensors(bool gradients) {
    (void)gradients;
    return Status::FailedPrecondition("this model gives no full tensors (it was not sharded by code)");
  }
  /// For a model that ModelFamily::ShardLoaded sharded: the full tensors of `local`, each
  /// (parameter name, tensor shaped as this rank's shard of that parameter: a reduced gradient,
  /// a parameter after a step) put together as the model shards that parameter (DTensor
  /// from_local with the parameter's mesh and placements, then full_tensor), in `local`'s
  /// order. A collective over the model's tp group: its ranks call it with the same names in
  /// the same order. Errors: INVALID_ARGUMENT naming an unknown parameter or a shard of the
  /// wrong shape, INTERNAL when gathering fails. Default: FAILED_PRECONDITION.
  virtual Result<NamedTensors> FullOfLocal(const NamedTensors& local) {
    (void)local;
    return Status::FailedPrecondition("this model gives no full tensors (it was not sharded by code)");
  }
  /// For a model that ModelFamily::ShardLoaded sharded: this rank's gradient of each parameter
  /// after a backward (named_parameters order, a tied weight once; zeros where it has none),
  /// shaped as this rank's shard and sharing storage with the model's own gradient. A gradient
  /// held in another layout than its parameter (a DTensor Partial gradient of a replicated
  /// weight) is first made the parameter's layout: a collective, every rank in the same order.
  /// Errors: INTERNAL with the cause. Default: FAILED_PRECONDITION.
  virtual Result<NamedTensors> LocalGradients() {
    return Status::FailedPrecondition("this model gives no local gradients (it was not sharded by code)");
  }
  /// True when the model reduces its gradients over the data-parallel ranks by itself (the
  /// adapter's own data parallelism, e.g. FSDP2 fully_shard, applied by ShardLoaded): after a
  /// backward, LocalGradients are already this rank's shard of the data-parallel sum, and the
  /// parameters it registers are this rank's shards. Default false.
  virtual bool ReducesDataParallelGradients() const { return false; }
  /// For a model that ModelFamily::ShardLoaded sharded: the global L2 norm of its gradients as
  /// its trainer computes it to clip, from this rank's shards (a Python adapter's grad_norm;
  /// without one torch.nn.utils.get_total_norm per device mesh, the meshes' norms combined, as
  /// torchtitan clips its expert and other parameters apart). A collective over the world.
  /// Errors: INTERNAL with the cause. Default: FAILED_PRECONDITION.
  virtual Result<double> ClippingGradNorm() {
    return Status::FailedPrecondition("this model gives no clipping norm (it was not sharded by code)");
  }
};

/// While one lives on a thread, ModelFamily::Construct and ConstructParallel called on that
/// thread may leave parameters uninitialised (torch::empty) instead of drawing upstream's
/// fresh-weight init: the caller loads every parameter from a checkpoint next, and the load
/// gate FAILs a parameter that no checkpoint key reaches (key coverage), so no uninitialised
/// value reaches a computation. This is transformers' `no_init_weights` during
/// from_pretrained. Initialising anyway is correct, only slower: for a 0.5B-parameter model the
/// init costs seconds and touches every page before the load overwrites it. Buffers computed
/// at construction (tables, masks) must still be computed. Scopes nest.
class SkipWeightInit {
 public:
  SkipWeightInit();
  ~SkipWeightInit();
  SkipWeightInit(const SkipWeightInit&) = delete;
  SkipWeightInit& operator=(const SkipWeightInit&) = delete;

 private:
  bool previous_;
};

/// True while a SkipWeightInit lives on the calling thread.
bool WeightInitSkipped();

/// Result of ParseConfig: the args and the field-by-field report.
struct ParsedConfig {
  std::shared_ptr<const ModelArgs> args;
  ConfigReport report;
};

/// One model family (llama, qwen2, ...). Implementations are stateless and thread-safe.
class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  /// The family's name as cells name it, e.g. "llama".
  virtual std::string_view name() const = 0;
  /// HF `model_type` strings this family serves, e.g. {"llama"}.
  virtual std::vector<std::string> model_types() const = 0;
  /// Maps HF config.json to args. Errors: INVALID_ARGUMENT naming the field and value for a
  /// missing required field, a wrong type, or a value the family cannot honour (e.g. an
  /// unknown rope_scaling type). Fields it does not know end up in report.unmapped.
  virtual Result<ParsedConfig> ParseConfig(const nlohmann::json& config) const = 0;
  /// Builds the model with parameters of `dtype` on `device`, freshly initialised unless a
  /// SkipWeightInit is alive on the calling thread (then they may be left uninitialised).
  virtual Result<std::shared_ptr<CausalLM>> Construct(const ModelArgs& args, torch::Dtype dtype,
                                                      torch::Device device) const = 0;
  /// The HF <-> internal name table for these args. Not called when MapsWeightsByCode().
  virtual Result<StateDictAdapter> Adapter(const ModelArgs& args) const = 0;

  /// True when checkpoint tensors reach parameters through code (FromHf / ToHf) rather than a
  /// name table: a Python-lane adapter's from_hf / to_hf, which may rename, stack, permute or
  /// fuse. The gates then prove the mapping by its results (state_dict_io: every parameter
  /// assigned with its shape, and to_hf(from_hf(checkpoint)) giving back exactly the
  /// checkpoint, bit for bit). Default false.
  virtual bool MapsWeightsByCode() const { return false; }
  /// Checkpoint tensors (every key, in the stored dtype, CPU) to {parameter name: tensor},
  /// names as the model's named_parameters() gives them, tensors in any dtype (the caller
  /// casts). `args` must be this family's. Errors: INVALID_ARGUMENT with the adapter's own
  /// message (a key it cannot map, an alias that differs). Default: UNIMPLEMENTED.
  virtual Result<NamedTensors> FromHf(const ModelArgs& args, const NamedTensors& hf) const {
    (void)args;
    (void)hf;
    return Status::FailedPrecondition("model family '" + std::string(name()) +
                                 "' maps weights by a name table (Adapter)");
  }
  /// The inverse: {parameter name: tensor} (any subset) to {checkpoint key: tensor}.
  /// Errors and default as FromHf.
  virtual Result<NamedTensors> ToHf(const ModelArgs& args, const NamedTensors& params) const {
    (void)args;
    (void)params;
    return Status::FailedPrecondition("model family '" + std::string(name()) +
                                 "' maps weights by a name table (Adapter)");
  }

  /// The family's tensor-parallel plan for these args at `tp_size` ranks: one ShardRule per
  /// internal parameter pattern, covering every parameter. Errors: INVALID_ARGUMENT naming
  /// the config field whose value `tp_size` does not divide; FAILED_PRECONDITION when the
  /// family has no tensor-parallel support (the default).
  virtual Result<TpPlan> Parallelize(const ModelArgs& args, int64_t tp_size) const {
    (void)args;
    (void)tp_size;
    return Status::FailedPrecondition("model family '" + std::string(name()) +
                                      "' has no tensor-parallel plan");
  }
  /// Builds this rank's part of the model for `tp`: parameters hold the local shards the plan
  /// of Parallelize(args, tp.size) describes (initialised as Construct's; the caller loads
  /// them), and
  /// Forward returns the full logits [B, T, vocab_size] on every rank. Collectives go through
  /// tp.comm; every rank must call Forward (and backward) together. Errors as Construct, and
  /// FAILED_PRECONDITION when the family has no tensor-parallel support (the default).
  virtual Result<std::shared_ptr<CausalLM>> ConstructParallel(const ModelArgs& args,
                                                              torch::Dtype dtype,
                                                              torch::Device device,
                                                              const TensorParallel& tp) const {
    (void)args;
    (void)dtype;
    (void)device;
    (void)tp;
    return Status::FailedPrecondition("model family '" + std::string(name()) +
                                      "' has no tensor-parallel support");
  }

  /// Builds this rank's part of a MoE model for `tp` and `ep`: as ConstructParallel for `tp`,
  /// and every stacked expert parameter [E, ...] holds this EP rank's E / ep.size experts
  /// ([E / ep.size, ...]: experts [ep.rank * E / ep.size, ...)), tokens dispatched to the
  /// rank that holds their expert and combined back through ep.comm (AllToAllRows). Forward
  /// returns this rank's logits for its own tokens; every rank of the EP group must call
  /// Forward (and backward) together, with the same number of calls. Errors as
  /// ConstructParallel; INVALID_ARGUMENT naming num_experts when ep.size does not divide it;
  /// FAILED_PRECONDITION when the family has no expert-parallel support (the default).
  virtual Result<std::shared_ptr<CausalLM>> ConstructExpertParallel(
      const ModelArgs& args, torch::Dtype dtype, torch::Device device, const TensorParallel& tp,
      const ExpertParallel& ep) const {
    (void)args;
    (void)dtype;
    (void)device;
    (void)tp;
    (void)ep;
    return Status::FailedPrecondition("model family '" + std::string(name()) +
                                      "' has no expert-parallel support");
  }

  /// True when the family's tensor parallelism is its own code run on a model built by
  /// Construct and loaded in full (ShardLoaded: a Python-lane adapter's parallelize over a
  /// torch.distributed DeviceMesh), not a plan the gates load shards through (Parallelize,
  /// ConstructParallel). The parallel gate then takes full parameters and gradients from
  /// CausalLM::FullTensors. Default false.
  virtual bool ShardsLoadedModel() const { return false; }
  /// Shards `model` (built by this family's Construct, every parameter loaded) over the
  /// tp.size ranks of this rank's tp group, tp.rank being this rank's place in it, and returns
  /// the sharded model: its Forward returns the full logits [B, T, vocab_size] on every rank of
  /// the group, its registered parameters are this rank's shards (the tensors the gates step in
  /// place), their gradients after a backward this rank's shards of the gradients, and
  /// FullTensors / FullOfLocal gather. `world_rank` of `world_size` is this rank's place in the
  /// world, laid out as common/mesh.h lays it (tp fastest: the tp groups are the runs of
  /// tp.size consecutive ranks; world_size / tp.size replicas of the model, data-parallel).
  /// tp.size may be 1. A family with data parallelism of its own (a Python adapter's
  /// data_parallel: FSDP2) applies it over the data-parallel ranks when there are several, and
  /// the model says so (CausalLM::ReducesDataParallelGradients). When `experts` is enabled
  /// the family splits a MoE model's experts over this rank's EP group first (a Python
  /// adapter's expert_parallel), summing expert gradients over its replica group; the model
  /// then reduces its own gradients.
  /// A collective over the world: every rank calls it together. The family joins its own group
  /// over the worker's rendezvous (MASTER_ADDR, MASTER_PORT). Errors: INVALID_ARGUMENT with the
  /// adapter's own message (e.g. a TP size that does not divide num_key_value_heads);
  /// UNAVAILABLE when the family's group cannot be formed; FAILED_PRECONDITION by default.
  virtual Result<std::shared_ptr<CausalLM>> ShardLoaded(std::shared_ptr<CausalLM> model,
                                                        const TensorParallel& tp,
                                                        int64_t world_rank,
                                                        int64_t world_size,
                                                        const ExpertGroups& experts) const {
    (void)model;
    (void)tp;
    (void)world_rank;
    (void)world_size;
    (void)experts;
    return Status::FailedPrecondition("model family '" + std::string(name()) +
                                      "' does not shard a loaded model");
  }
};

/// The families a worker knows, keyed by name and by HF model_type. Not thread-safe; filled
/// once at start-up before gates run.
class FamilyRegistry {
 public:
  /// Errors: ALREADY_EXISTS when the name or one of its model_types is taken.
  Status Register(std::unique_ptr<ModelFamily> family);
  /// nullptr when unknown.
  const ModelFamily* FindByName(std::string_view name) const;
  const ModelFamily* FindByModelType(std::string_view model_type) const;
  std::vector<std::string> Names() const;

 private:
  std::vector<std::unique_ptr<ModelFamily>> families_;
};

}  // namespace gatehouse::worker

/// Entry points every plugin exports (use GATEHOUSE_DEFINE_PLUGIN).
extern "C" {
typedef int (*GatehousePluginAbiVersionFn)();
typedef int (*GatehousePluginRegisterFn)(gatehouse::worker::FamilyRegistry* registry,
                                         char* error, int error_size);
}

/// Defines the plugin entry points. `register_fn` is a function
/// `gatehouse::Status (gatehouse::worker::FamilyRegistry&)` that registers the families.
#define GATEHOUSE_DEFINE_PLUGIN(register_fn)                                                \
  extern "C" __attribute__((visibility("default"))) int gatehouse_plugin_abi_version() {   \
    return ::gatehouse::worker::kPluginAbiVersion;                                         \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int gatehouse_plugin_register(         \
      ::gatehouse::worker::FamilyRegistry* registry, char* error, int error_size) {        \
    ::gatehouse::Status s = register_fn(*registry);                                         \
    if (s.ok()) return 0;                                                                   \
    std::string m = s.ToString();                                                           \
    if (error_size > 0) {                                                                   \
      size_t n = std::min(m.size(), static_cast<size_t>(error_size - 1));                   \
      std::memcpy(error, m.data(), n);                                                      \
      error[n] = '\0';                                                                      \
    }                                                                                       \
    return 1;                                                                               \
  }
