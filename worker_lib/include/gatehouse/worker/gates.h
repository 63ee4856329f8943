// The gates (docs/architecture.md "Phases, statuses and blame") and the runner that executes
// them in order.
//
// Each gate is a function GateContext& -> GateOutcome. It reads the run spec, uses and extends
// the state earlier gates left in the context (checkpoint, family, args, model, adapter,
// reference), and returns a status with figures and artifacts; the runner turns the outcome
// into events (docs/protocols.md §4). A gate never throws: the runner catches c10::Error
// (FAIL, native_runtime) and std::exception (FAIL, unknown) around each one, so bad input
// can never crash the worker.
//
// Decisions recorded here:
//  - identity: a checkout at another SHA or a dirty tree is FAIL, classification unknown (the
//    evidence cannot be attributed to the frozen commit; not the adapter's contract); a torch
//    pin mismatch or device cuda without CUDA is BLOCKED (never silently accepted).
//    So is a checkpoint or reference whose content digest on this node differs from the
//    frozen one (or that is missing): the evidence would belong to other inputs.
//  - Gates do not write events themselves: they return figures and artifacts in GateOutcome
//    and the runner emits them (so GateContext carries no event sink, and gates are testable
//    without one).
//  - The config gate reads config.json only (Checkpoint::ReadConfig); the load gate opens and
//    validates the tensor files. An unreadable config.json, a missing, truncated or
//    inconsistent tensor file, NaN/Inf in a weight, or a tied model's lm_head.weight that
//    differs from the embedding is BLOCKED (the input's fault, not the adapter's); key
//    coverage and shape problems are FAIL adapter_contract.
//  - A requested phase whose prerequisite was not requested (e.g. inference without load)
//    ends UNKNOWN: the fact it needs (a loaded model) is missing.
//  - A missing or malformed reference bundle ends the gate that needs it UNKNOWN.
//  - Tied embeddings: a checkpoint of a tied model that still ships the tied alias
//    (lm_head.weight) is accepted when its values equal the embedding's (as upstream ties only
//    equal weights); the alias is not loaded and figure tied_lm_head says which weight is used.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/phases.h"
#include "common/status.h"
#include "gatehouse/worker/checkpoint.h"
#include "gatehouse/worker/events.h"
#include "gatehouse/worker/model_family.h"
#include "gatehouse/worker/reference.h"
#include "gatehouse/worker/run_spec.h"
#include "gatehouse/worker/safetensors_scan.h"
#include "gatehouse/worker/state_dict_adapter.h"
#include "gatehouse/worker/tensor_parallel.h"

namespace gatehouse::worker {

/// What one gate found.
struct GateOutcome {
  GateStatus status = GateStatus::kPass;
  /// Empty on PASS; says why otherwise (names the tensor, field, figure and threshold).
  std::string reason;
  /// Meaningful on FAIL only.
  FailureClass classification = FailureClass::kUnknown;
  std::vector<Figure> figures;
  std::vector<Artifact> artifacts;

  /// Sets status, reason and classification (keeps figures); returns *this.
  GateOutcome& Set(GateStatus s, std::string why, FailureClass c = FailureClass::kUnknown);
  GateOutcome& Fail(FailureClass c, std::string why) { return Set(GateStatus::kFail, std::move(why), c); }
  GateOutcome& Blocked(std::string why) { return Set(GateStatus::kBlocked, std::move(why)); }
  GateOutcome& Unknown(std::string why) { return Set(GateStatus::kUnknown, std::move(why)); }
  GateOutcome& Skipped(std::string why) { return Set(GateStatus::kSkipped, std::move(why)); }

  void Count(std::string name, int64_t value) { figures.push_back({std::move(name), value, "count"}); }
  void Bytes(std::string name, int64_t value) { figures.push_back({std::move(name), value, "bytes"}); }
  void Real(std::string name, double value, std::string unit) {
    figures.push_back({std::move(name), value, std::move(unit)});
  }
  void Text(std::string name, std::string value) {
    figures.push_back({std::move(name), std::move(value), "text"});
  }
  /// The figure named `name`, or nullptr (tests, and gates that read their own figures).
  const Figure* Find(std::string_view name) const;
  /// Moves the figures named in `names` to the front, in that order (the others keep theirs):
  /// what a report shows first of a gate with many figures. Names it lacks are ignored.
  void Lead(const std::vector<std::string_view>& names);
};

/// The runtime the worker actually runs on (identity gate, cuda_graph gate).
struct RuntimeInfo {
  /// LibTorch version the library reports at run time with any local suffix ("+cu130")
  /// stripped, e.g. "2.11.0"; from at::show_config()'s TORCH_VERSION, else the header macro.
  std::string torch_version;
  /// TORCH_VERSION of the headers the worker was compiled against.
  std::string torch_headers_version;
  bool cuda_available = false;     // torch::cuda::is_available()
  int64_t cuda_device_count = 0;   // torch::cuda::device_count()
  /// CUDA stack versions (cuda_graph.h ProbeCudaVersions): CUDA runtime LibTorch was built
  /// with ("13.0"), cuDNN, NCCL, and the driver's CUDA version; empty when absent.
  std::string cuda_version, cudnn_version, nccl_version, cuda_driver_version;
};

/// Probes the running LibTorch.
RuntimeInfo ProbeRuntime();

/// The runtime as `gatehouse-worker --print-runtime` prints it and the agent reports it
/// (docs/protocols.md §3.2): {"torch", "torch_headers", "cuda", "cudnn", "nccl",
/// "cuda_driver", "cuda_available", "cuda_device_count", "nccl_groups"}; versions are strings,
/// "" when absent.
nlohmann::json RuntimeJson(const RuntimeInfo& runtime);

/// "2.11.0+cu130" -> "2.11.0": the major.minor.patch a runtime pin is compared with.
std::string StripLocalVersion(std::string_view version);

/// Parameters of a module grouped by identity: a tensor registered under several names (tied
/// weights) is one group. Order: first appearance in named_parameters().
struct ParamGroup {
  std::vector<std::string> names;  // all names of this tensor, in registration order
  torch::Tensor tensor;
};
std::vector<ParamGroup> UniqueParameters(const torch::nn::Module& module);

/// Coverage of a checkpoint -> model load, both ways (the load gate's evidence). A stacked
/// parameter (StateDictAdapter slices, e.g. MoE experts [E, ...]) is loaded one HF tensor per
/// slice along dim 0; "-> param[e]" names slice e.
struct LoadReport {
  int64_t keys_total = 0;    // tensors in the checkpoint
  int64_t keys_used = 0;     // copied into a parameter
  /// Expert parallelism (ShardedLoad::ep_size > 1): keys of experts another EP rank holds,
  /// not loaded here (not unexpected either).
  int64_t keys_other_ranks = 0;
  int64_t params_total = 0;  // distinct parameter tensors of the model
  /// Parameters written in full: a stacked one only when every slice along dim 0 was.
  int64_t params_loaded = 0;
  uint64_t bytes_loaded = 0;  // checkpoint bytes of the used tensors
  /// Of bytes_loaded, those whose parameter now is the mapped file itself, copy-on-write
  /// (a CPU parameter of the stored dtype and shape that no other tensor views): no copy made.
  uint64_t bytes_adopted = 0;
  /// The checkpoint keys of those parameters, sorted.
  std::vector<std::string> adopted_keys;
  /// Wall time of the finiteness checks (one read of every loaded weight not in the scan), in ms.
  double finite_check_ms = 0;
  /// Of bytes_loaded, those whose NaN/Inf count came from the identity gate's scan (no read).
  uint64_t bytes_finite_from_scan = 0;
  /// "hf_name (-> internal)" the adapter expects but the checkpoint lacks (a missing expert
  /// is named by its own key), and parameters (or slices of a stacked one) no checkpoint key
  /// loaded.
  std::vector<std::string> missing;
  /// Checkpoint keys no name-table row maps (and that are not the tied alias).
  std::vector<std::string> unexpected;
  /// Rows that map a checkpoint key to a parameter the model does not have.
  std::vector<std::string> unknown_params;
  /// "key (-> param): checkpoint [a, b] vs model [c, d]"; for a slice the model shape is the
  /// slice's, followed by " (slice of [E, c, d])", or "model [..] has no slice e along dim 0".
  std::vector<std::string> shape_mismatches;
  /// "key (-> param): n NaN, m Inf" after conversion to the model dtype.
  std::vector<std::string> nonfinite;
  /// Parameters (or slices "param[e]") two checkpoint keys wrote.
  std::vector<std::string> loaded_twice;
  /// Set when the checkpoint ships the tied alias of a tied model (accepted, not loaded).
  std::string tied_alias;
  /// Families that map weights by code (LoadStateDictByCode): the adapter's own error when its
  /// from_hf refused the checkpoint (it names the key), and the checkpoint keys whose round trip
  /// to_hf(from_hf(checkpoint)) does not give back the same tensor bit for bit, or that the
  /// round trip invents.
  std::string adapter_error;
  std::vector<std::string> round_trip;

  bool ok() const {
    return missing.empty() && unexpected.empty() && unknown_params.empty() &&
           shape_mismatches.empty() && nonfinite.empty() && loaded_twice.empty() &&
           adapter_error.empty() && round_trip.empty();
  }
};

/// Copies every checkpoint tensor into the model parameter the adapter maps it to (or into
/// slice e along dim 0 of a stacked parameter, StateDictAdapter::Resolve), converted to the
/// parameter's dtype and device, and records coverage both ways. Shape mismatches (against
/// the slice for a stacked parameter) and non-finite tensors are recorded, not copied. Only an unreadable tensor is an error
/// (the checkpoint's Load status, naming the key).
///
/// With `shard` (tensor parallelism) each checkpoint tensor is first cut to this rank's shard
/// by the plan rule of its parameter (TpPlan::Shard; the expert dimension of a stacked
/// parameter is taken off first), and shapes are compared with the local shape the plan gives;
/// a parameter no plan rule covers, or a dimension the TP size does not divide, is a shape
/// mismatch naming the rule. With expert parallelism (ShardedLoad::ep_size > 1) the slice e of
/// a stacked parameter of local size n is the checkpoint's expert ep_rank * n + e: an expert
/// outside this rank's range is skipped (keys_other_ranks), the others load as above.
///
/// With `scan` (the identity gate's count of the same files' bytes, safetensors_scan.h) a
/// parameter that adopts its tensor's mapped bytes takes that tensor's NaN/Inf count from the
/// scan instead of reading the bytes again; any other (converted, sliced, sharded, or not in
/// the scan) is counted after conversion as before.
struct ShardedLoad {
  const TpPlan* plan = nullptr;  // null: no tensor-parallel sharding
  int64_t rank = 0;              // the TP rank
  /// Expert parallelism: a stacked parameter [E / ep_size, ...] holds slices
  /// [ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size) of the checkpoint's experts; the
  /// other experts' keys are counted as used by another rank (LoadReport::keys_other_ranks).
  int64_t ep_rank = 0;
  int64_t ep_size = 1;
};
Result<LoadReport> LoadStateDict(const Checkpoint& checkpoint, const StateDictAdapter& adapter,
                                 CausalLM& model, const ShardedLoad* shard = nullptr,
                                 const safetensors::FiniteScan* scan = nullptr);

/// LoadStateDict for a family that maps weights by code (ModelFamily::MapsWeightsByCode: the
/// Python lane). Every checkpoint tensor (a view of the mapped file where writes are private,
/// else a copy) goes through family.FromHf; each tensor it returns is copied into the parameter
/// it names, converted to the parameter's dtype and device. Coverage both ways, proved by the
/// results rather than a table:
///  - every parameter group assigned exactly once (missing, loaded_twice), by a name the model
///    has (unknown_params), with the parameter's shape (shape_mismatches), finite (nonfinite);
///  - every checkpoint key consumed: family.ToHf over what FromHf returned gives back every
///    key with a bit-equal tensor (a key it lacks is unexpected: from_hf dropped it; a key
///    whose tensor differs, or one the checkpoint lacks, is in round_trip).
/// keys_used counts the keys the round trip gives back equal; nothing is adopted. A FromHf
/// error is recorded in adapter_error (not returned); only an unreadable tensor is an error.
Result<LoadReport> LoadStateDictByCode(const Checkpoint& checkpoint, const ModelFamily& family,
                                       const ModelArgs& args, CausalLM& model);

/// The inverse of LoadStateDict: every parameter group under its HF name, a stacked parameter
/// slice by slice along dim 0 (StateDictAdapter::HfSlices), in group order. Tensors are
/// detached views, not copies. Groups that cannot be named are listed, not returned.
struct HfTensors {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, std::string> hf_to_internal;  // HF name -> "param" or "param[e]"
  std::vector<std::string> unmapped;    // "param (why)": no row of the name table
  std::vector<std::string> duplicated;  // "hf (from a and b)"
  std::vector<std::string> miscounted;  // a stacked parameter with the wrong dim 0
  bool ok() const { return unmapped.empty() && duplicated.empty() && miscounted.empty(); }
  /// "inverse mapping (HfSlices): no HF name for ...; HF name written twice: ...".
  std::string Problems() const;
};
HfTensors ToHfTensors(const std::vector<ParamGroup>& groups, const StateDictAdapter& adapter);
/// ToHfTensors for a family that maps weights by code: family.ToHf on each group alone
/// ({first name: tensor}), which names the keys that group makes (hf_to_internal: key ->
/// the group's first name, no slice). Tensors are what ToHf returns (views or copies). A
/// group ToHf refuses is unmapped (with its message), a key two groups make is duplicated.
HfTensors ToHfTensorsByCode(const std::vector<ParamGroup>& groups, const ModelFamily& family,
                            const ModelArgs& args);

/// Logit comparison against the reference, accumulated over prompts.
///
/// Per token t (source: docs/gate-facts.md "Comparing logits"; torch.nn.functional.kl_div with
/// reduction "batchmean" over tokens): KL_t(ref || ours) = sum_v p_ref(v) (log p_ref(v) -
/// log p_ours(v)), with p = softmax over the vocabulary, computed in float64. kl_mean is the
/// mean of KL_t over ALL tokens of all prompts (never also divided by the vocabulary size).
/// Units: KL in nats; logit differences in logits.
class LogitComparison {
 public:
  /// ref, ours: [T, V] logits (any floating dtype, CPU). Returns KL_t of each position, [T]
  /// float64 nats (what the dashboard plots along the position). Throws c10::Error on shape
  /// mismatch.
  torch::Tensor Add(const torch::Tensor& ref, const torch::Tensor& ours);

  int64_t tokens() const { return tokens_; }
  double kl_mean() const;                // nats; NaN when no token was added
  double kl_max() const { return kl_max_; }
  double top1_agreement_percent() const;  // % tokens with equal argmax
  /// % tokens with equal argmax or whose flip is a near-tie: the reference ranks its top-1 and
  /// ours within `near_tie_gap` nats of log-probability (bars.h NearTieGap: a flip the max-abs
  /// bar allows).
  double top1_agreement_percent(double near_tie_gap) const;
  /// Of the flips, those within `near_tie_gap` nats.
  int64_t near_tie_flips(double near_tie_gap) const;
  double max_abs_diff() const { return max_abs_; }
  double mean_abs_diff() const;           // mean over all T x V elements

 private:
  /// Add over a slice of positions (Add cuts [T, V] into such slices); returns their KL.
  torch::Tensor AddRows(const torch::Tensor& ref, const torch::Tensor& ours);
  double kl_sum_ = 0;
  double kl_max_ = 0;
  int64_t tokens_ = 0;
  int64_t top1_equal_ = 0;
  /// Per top-1 flip: the reference's log-prob of its top-1 minus that of ours (>= 0).
  std::vector<double> flip_gaps_;
  double max_abs_ = 0;
  double abs_sum_ = 0;
  int64_t elements_ = 0;
};

/// Everything the gates share. Filled by the worker (spec, registry, plugin_errors, runtime)
/// and then by the gates in order. Not thread-safe.
struct GateContext {
  RunSpec spec;
  const FamilyRegistry* registry = nullptr;
  /// "plugin <path> failed to load: <why>", one per plugin that did not load; config FAILs.
  std::vector<std::string> plugin_errors;
  RuntimeInfo runtime;
  /// This worker's place in its group of ranks (torchrun variables; distributed.h). Rank 0's
  /// events are the attempt's evidence; ranks > 0 run only the phases the parallel gate needs
  /// (RunGates).
  int64_t rank = 0;
  int64_t world_size = 1;
  /// The group's collectives; null when world_size is 1.
  std::shared_ptr<TpCommunicator> comm;
  /// Groups over subsets of the world (a mesh dimension's ranks); null when world_size is 1.
  std::shared_ptr<SubgroupFactory> subgroups;
  /// The group's c10d backend: "gloo" or "nccl" (chosen by the device); empty when alone.
  std::string comm_backend;
  /// CUDA device index of this rank for a cuda cell: LOCAL_RANK in an NCCL group, else 0.
  int device_index = 0;
  /// The parallel gate's measure-only mode (gatehouse-worker --parallel-measure-only, for
  /// tools/bench/parallel_layouts.py; never set by the agent): the layout trains its steps
  /// with no single-rank control and nothing compared (world size 1 trains the whole model
  /// alone, the control's own cost), and the gate ends SKIPPED with each rank's step times.
  /// The gate releases the loaded `model` first (rss_layout_start_bytes): no later phase may
  /// run.
  bool parallel_measure_only = false;

  // --- state carried between gates -------------------------------------------------------
  /// identity: NaN/Inf counts of the checkpoint's tensors, from the bytes its digest read.
  std::shared_ptr<const safetensors::FiniteScan> checkpoint_scan;
  std::optional<Checkpoint> checkpoint;       // load
  const ModelFamily* family = nullptr;        // config
  std::shared_ptr<const ModelArgs> args;      // config
  torch::Dtype dtype = torch::kFloat32;       // construct (from spec.precision)
  torch::Device device = torch::kCPU;         // construct (from spec.runtime.device)
  std::shared_ptr<CausalLM> model;            // construct; loaded by load
  bool model_loaded = false;                  // load PASSed
  std::optional<StateDictAdapter> adapter;    // load
  std::optional<LoadReport> load_report;      // load
  std::optional<ReferenceBundle> reference;   // read on first use (inference, decode, ...)
};

GateOutcome IdentityGate(GateContext& ctx);
GateOutcome ConfigGate(GateContext& ctx);
GateOutcome ConstructGate(GateContext& ctx);
GateOutcome LoadGate(GateContext& ctx);
/// The inference gate: our logits on every reference prompt against upstream's run in the
/// cell's precision (the bundle's bf16 run for a bf16 cell), judged by the bars of the site
/// (bars.h LogitBarsFor: max abs diff, KL, top-1); the bars and their basis are figures.
GateOutcome InferenceGate(GateContext& ctx);
/// The decode gate, two parts on every reference prompt:
///  - logits: our KV-cached decode, fed upstream's greedy tokens (ForcedDecodeLogits), must
///    give upstream's decode-step logits (bundle decode_logits) within the site's bars, and
///    upstream's teacher-forced continuation logits within those bars widened by upstream's
///    own cached-vs-forced spread (measured on the bundle itself);
///  - ids: our free greedy decode must equal upstream's ids; where the bars allow a logit
///    difference a prompt may diverge once at a near-tie (log-prob gap <= twice the step
///    max-abs bar, or 0.1 nats without one), after which it is not compared.
/// A model that recomputes the sequence at each step (CausalLM::CachesKeysAndValues false) is
/// held the other way round: to upstream's teacher-forced logits within the site's bars, and
/// to upstream's decode within those widened by the spread (docs/bars.md).
/// Figures: both comparisons, ids, text (tokenizer.json), the continuations' distinct tokens.
GateOutcome DecodeGate(GateContext& ctx);
/// The packing gate, two parts on the reference prompts packed into one row (cu_seqlens,
/// positions restarting at 0 for each sequence; CausalLM::ForwardPacked):
///  - logits: each sequence's logits in the packed row equal its own forward's (bit-equal, or
///    within PackingBarsFor: fp32 KL <= 1e-9 per token; both top-1 100 %);
///  - training: the packed step's loss (next-token cross-entropy, mean over every predicted
///    token) and every parameter's gradient equal the unpacked batch's (each sequence alone,
///    the same mean) within the bars.
/// A model without a packed forward FAILs (adapter contract).
GateOutcome PackingGate(GateContext& ctx);
/// The logprob_parity gate: for every reference prompt, max_new_tokens tokens sampled at
/// temperature 1 (seed: training.seed) with the KV cache, each chosen token's log-prob
/// recorded (float32 log_softmax of the step's logits), then the full sequences scored by one
/// teacher-forced, train-mode forward (packed with cu_seqlens when the model has
/// ForwardPacked). Figures: mean and max abs log-prob diff and the k3 KL estimator; in mode
/// cuda_graph on a CUDA device the graph's decode is compared the same way. FAILs (adapter
/// contract) when a mean exceeds LogprobBarsFor.
GateOutcome LogprobParityGate(GateContext& ctx);
/// The training gate: the cell's AdamW steps on the reference prompts (step s trains on prompt
/// (s - 1) mod P, next-token cross-entropy), against upstream's trace (bundle "training"):
///  - the trainable set, by checkpoint key through the adapter's inverse mapping, equals
///    upstream's (a key upstream trains that the adapter freezes or lacks, or one it trains
///    that upstream does not, FAILs naming it);
///  - every trainable parameter gets a finite, nonzero gradient, and its L2 norm and the sum of
///    its elements (sign-sensitive) at step 1 equal upstream's within TrainingBarsFor;
///  - the loss of step 1, and of every later step the trace holds when the cell's lr is the
///    trace's, equals upstream's within the bars;
///  - every weight upstream's steps changed (by the cell's step count) changed here too (in
///    bf16 an update below half an ulp rounds away, upstream's too).
GateOutcome TrainingGate(GateContext& ctx);
GateOutcome SaveGate(GateContext& ctx);
/// Tensor-parallel parity (docs/gate-facts.md "Tensor parallelism": TP=1 on the same checkpoint is
/// the control). Every rank builds its shard of the model (ModelFamily::ConstructParallel),
/// loads it from the checkpoint through the family's plan (Parallelize, LoadStateDict with a
/// ShardedLoad) and checks each local shape against the plan; rank 0 also builds the TP=1
/// control from the same checkpoint. Then, on the reference prompts: logits of TP=N vs TP=1
/// (fp32: KL < 1e-6 nats/token and top-1 100 %; bf16: KL < 1e-3 and top-1 >= 99 % over the
/// decided tokens: those whose upstream fp32 top-1 margin exceeds twice upstream's own bf16
/// rounding of the token's logits, from the reference bundle); one training step's loss and
/// every gathered gradient (max abs difference relative to the control's max abs: fp32 < 1e-4;
/// bf16 < 5e-2 or, if wider, 4x the tensor's bf16-vs-fp32 spread on the control); and the
/// save: the gathered parameters under HF names written to parallel/tp<N>/model.safetensors,
/// compared bit for bit (tensors and file SHA-256) with the TP=1 control's save in
/// parallel/tp1/ (before any optimizer step: it proves the gather and naming of the save path,
/// not the plan's numerics); replicated parameters' gradients must agree across ranks (same
/// relative bar). Figures per rank are gathered to rank 0 (param_elements_rank<r>). A family that
/// shards by its own code (ModelFamily::ShardsLoadedModel: the Python lane's parallelize)
/// instead builds and loads the full model on every rank, shards it (ShardLoaded), and gives
/// full parameters and gradients through CausalLM::FullTensors; every rank's full gradient must
/// agree with rank 0's, and a parallelize after which every rank still holds all of the TP=1
/// model's elements FAILs (figure param_elements_tp1). SKIPPED at world
/// size 1; BLOCKED when the topology asks for dp/pp/ep > 1 (not implemented) or the worker was
/// not started as the rank group the topology asks for; FAIL adapter_contract when the family
/// has no plan, the TP size does not divide a config field, a shard does not load, or a rank's
/// logits are not the full [1, T, vocab] or differ from rank 0's (same bars). Ranks agree on
/// readiness before each collective step and share their reasons, so one rank's failure never
/// leaves the others waiting in a collective.
GateOutcome ParallelGate(GateContext& ctx);
/// The cuda_graph gate: graph vs eager greedy decode token for token on every reference
/// prompt, ms/token and speedup at batch 1, 4, 16 (cuda_graph.h). SKIPPED without CUDA.
GateOutcome CudaGraphGate(GateContext& ctx);
/// The performance gate: prefill tokens/s, decode ms/token (eager; CUDA-graph on CUDA), AdamW
/// step ms and CUDA peak allocator bytes, each beside transformers' on the same inputs
/// (tools/bench/hf_peer.py via GATEHOUSE_PEER_PYTHON) and as a ratio; BLOCKED without a peer.
GateOutcome PerformanceGate(GateContext& ctx);

/// Greedy decode with the model's KV cache: prefill `prompt` ([T] int64), then one token per
/// step, argmax of the last position's logits, `max_new_tokens` tokens. Returns the new ids
/// [N] int64 on CPU. `ms_per_token` (optional) receives the mean wall time of the decode steps
/// after the prefill (ms).
torch::Tensor GreedyDecode(CausalLM& model, const torch::Tensor& prompt, int64_t max_new_tokens,
                           torch::Device device, double* ms_per_token = nullptr);

/// Decode with the model's KV cache along given tokens (teacher forcing): prefill `prompt` ([T]
/// int64), then feed forced[0], ..., forced[N-2] one per step. Returns the logits that predict
/// forced[k] as row k: [N, V] float32 on the CPU, N = forced.size(0) (row 0 is the prefill's
/// last position).
torch::Tensor ForcedDecodeLogits(CausalLM& model, const torch::Tensor& prompt,
                                 const torch::Tensor& forced, torch::Device device);

using GateFn = std::function<GateOutcome(GateContext&)>;
struct GateDef {
  std::string_view phase;  // a name of kPhases
  GateFn fn;
};

/// The thirteen gates in kPhases order.
std::vector<GateDef> DefaultGates();

/// The phases a rank > 0 of a worker group runs (the parallel gate and what it needs); the
/// others end SKIPPED "rank r of N: phase p runs on rank 0 only".
inline constexpr std::string_view kPhasesOnEveryRank[] = {"identity", "config", "construct",
                                                          "load", "parallel"};

/// Runs `gates` in order and reports each phase:
///  - requested and no earlier requested phase stopped the run: phase_start, the gate's
///    figures and artifacts, the runner's memory figures (peak_rss_bytes: the process's peak
///    resident set during the phase, VmHWM reset at its start; rss_end_bytes: VmRSS at its
///    end; Linux only, left out where /proc cannot say), phase_end (a non-PASS status without
///    a reason gets one);
///  - requested after a phase ended FAIL/BLOCKED/UNKNOWN: phase_end SKIPPED
///    "skipped: earlier phase <name> ended <STATUS>";
///  - not requested: phase_end SKIPPED "not requested".
/// Skipped phases get no phase_start (they never started). Ends with run_end, whose status is
/// FAIL if any phase failed, else BLOCKED, else UNKNOWN, else PASS; it is also returned.
GateStatus RunGates(GateContext& ctx, EventWriter& events,
                    const std::vector<GateDef>& gates = DefaultGates());

}  // namespace gatehouse::worker
