// The cell spec: every input that can change a cell's result, as one typed value read in one
// place (docs/protocols.md §1 the submit body, §2 the frozen spec). The controller parses submit
// bodies and freezes specs with it, the scheduler reads a cell's demand from it, the agent
// launches ranks from it and the worker's run spec is this spec plus the attempt's facts.
// Every default and every limit lives here. Torch-free and transport-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/mesh.h"
#include "common/status.h"

namespace gatehouse {

/// The frozen spec's format version (member `spec_version`).
inline constexpr int64_t kCellSpecVersion = 1;

/// Limits on the knobs of a cell. A submit body past one is refused (REST 400) naming the field
/// and the value; a frozen spec past one is refused by the agent and the worker the same way.
struct CellSpecLimits {
  /// Worker ranks one cell may ask for: the topology's mesh, one process per rank.
  static constexpr int64_t kMaxWorldSize = 64;
  /// Optimizer steps of the training phase (the reference trace holds 4).
  static constexpr int64_t kMaxTrainingSteps = 1000;
  /// AdamW learning rate, exclusive of 0.
  static constexpr double kMaxLearningRate = 1.0;
  /// Tokens the decode phase generates per prompt.
  static constexpr int64_t kMaxNewTokens = 4096;
  /// Entries of `env`, and the bytes of one name and of one value.
  static constexpr size_t kMaxEnvEntries = 64;
  static constexpr size_t kMaxEnvNameBytes = 256;
  static constexpr size_t kMaxEnvValueBytes = 4096;
  /// Bytes of a path, a repository, a branch, a model family or a version pin.
  static constexpr size_t kMaxPathBytes = 4096;
  static constexpr size_t kMaxBranchBytes = 1024;
  static constexpr size_t kMaxNameBytes = 128;
  /// Scheduling priority (submit body only; never part of the identity).
  static constexpr int64_t kMinPriority = -100;
  static constexpr int64_t kMaxPriority = 100;
  /// Probe prompts of a reference cell, the token ids of one prompt, and the bytes of one
  /// prompt's text.
  static constexpr size_t kMaxPrompts = 16;
  static constexpr size_t kMaxPromptTokens = 32768;
  static constexpr size_t kMaxPromptTextBytes = 65536;
};

/// The two kinds of cell (docs/protocols.md §2). A validation cell runs an adapter's gates; a
/// reference cell runs upstream (transformers) on a checkpoint and makes the reference bundle
/// (protocols.md §6) that validation cells compare with.
inline constexpr std::string_view kValidationKind = "validation";
inline constexpr std::string_view kReferenceKind = "reference";

/// A directory with its content digest ("sha256:<hex>", common/sha256.h DirectoryDigest). The
/// identity gate recomputes the digest on the node and BLOCKs on a mismatch.
struct DigestedPath {
  std::string path;    // absolute, lexically normal, no trailing '/'
  std::string digest;  // empty in a submit body (the controller fills it when freezing)
  bool operator==(const DigestedPath&) const = default;
};

/// Where a validation cell's reference bundle comes from: a directory (path and digest), or
/// the bundle a reference cell made (`cell`: its id). In the run spec the agent fills path and
/// digest of the bundle it fetched for a `cell` (docs/protocols.md §3).
struct ReferenceInput : DigestedPath {
  std::string cell;  // 64 lower-case hex; empty: the bundle is the directory `path`
  bool operator==(const ReferenceInput&) const = default;
};

/// One probe prompt of a reference cell: token ids, or text tokenized by the checkpoint's own
/// tokenizer (with its chat template when `chat`).
struct Prompt {
  std::vector<int64_t> ids;  // non-empty xor text non-empty
  std::string text;
  bool chat = false;
  bool operator==(const Prompt&) const = default;
};

/// The frozen spec of a cell (docs/protocols.md §2), every member with its default.
///
/// A reference cell (`kind` "reference") uses only checkpoint, runtime (torch, transformers,
/// device), decode, training, prompts, env and phases (identity, reference); its other members
/// keep their defaults and are not part of its frozen form.
struct CellSpec {
  int64_t spec_version = kCellSpecVersion;
  std::string kind = std::string(kValidationKind);  // "validation" | "reference"
  std::string repository;    // URL (scheme://...) or absolute path
  std::string commit;        // 40 lower-case hex; empty in a submit body naming only a branch
  std::string model_family;  // the registered family the worker runs
  DigestedPath checkpoint;   // Hugging Face checkpoint directory (config.json in it)
  ReferenceInput reference;  // the reference bundle (reference.json + .safetensors)
  /// A cell that must PASS before this one is scheduled (its id; empty: none), e.g. TP=1 for a
  /// TP=4 variant. A reference.cell is waited for the same way without being named here.
  std::string control;
  /// Reference cells: the probe prompts; empty: chosen from the checkpoint's config.json.
  std::vector<Prompt> prompts;

  struct Runtime {
    std::string torch;          // pinned torch version, "2.11.0"
    std::string device = "cpu";  // "cpu" | "cuda"
    std::string cuda;           // pinned CUDA "major.minor" ("13.0"); empty: not pinned
    std::string gpu_model;      // pinned GPU model ("H200"); empty: any GPU
    std::string transformers;   // reference cells: pinned transformers version ("5.24.0")
    bool operator==(const Runtime&) const = default;
  } runtime;

  struct Launch {
    std::string runner = "gatehouse-worker";
    int64_t processes_per_rank = 1;
    bool operator==(const Launch&) const = default;
  } launch;

  /// The parallel layout, a device mesh (common/mesh.h, torchtitan's dimension names): `dp`
  /// is the data-parallel replicate degree (torchtitan's dp_replicate), `dp_shard` the FSDP
  /// degree, `ep` borrows its ranks from dp_shard x cp (x tp when etp is 1). dp_shard, cp and
  /// etp enter the frozen spec only when not 1, so a cell frozen before they existed keeps
  /// its identity.
  struct Topology {
    int64_t tp = 1, dp = 1, pp = 1, ep = 1;  // each 1..kMaxWorldSize
    int64_t dp_shard = 1, cp = 1, etp = 1;   // each 1..kMaxWorldSize
    /// pp x dp x dp_shard x cp x tp: the worker ranks the agent launches ("ep" adds none);
    /// at most CellSpecLimits::kMaxWorldSize once parsed.
    int world_size() const { return static_cast<int>(tp * dp * pp * dp_shard * cp); }
    MeshShape mesh_shape() const {
      return {.pp = pp, .dp_replicate = dp, .dp_shard = dp_shard, .cp = cp, .tp = tp,
              .ep = ep, .etp = etp};
    }
    bool operator==(const Topology&) const = default;
  } topology;

  std::string precision = "fp32";  // "fp32" | "bf16"
  std::string mode = "eager";      // "eager" | "cuda_graph"

  struct Decode {
    int64_t max_new_tokens = 32;    // 1..kMaxNewTokens
    std::string sampling = "greedy";  // "greedy" only
    bool operator==(const Decode&) const = default;
  } decode;

  struct Training {
    int64_t steps = 2;   // 2..kMaxTrainingSteps AdamW steps
    double lr = 1e-3;    // (0, kMaxLearningRate]
    int64_t seed = 1234;  // >= 0
    bool operator==(const Training&) const = default;
  } training;

  /// Extra environment of every rank (names without '=' or NUL; values without NUL).
  std::map<std::string, std::string> env;
  /// Requested phases: names of kPhases (common/phases.h), no duplicates, in kPhases order.
  std::vector<std::string> phases;

  /// True when `phase` is in `phases`.
  bool Requested(std::string_view phase) const;
  /// True for a reference cell.
  bool IsReference() const { return kind == kReferenceKind; }
  bool operator==(const CellSpec&) const = default;
};

/// Parses a frozen spec (docs/protocols.md §2) strictly: every member present except
/// runtime.cuda and runtime.gpu_model, no unknown member at any depth, every value in range.
/// Errors: INVALID_ARGUMENT naming the field and the value, e.g. "missing field
/// 'training.steps'", "unknown field 'topology.zz'", "field 'training.steps': expected an
/// integer from 2 to 1000, got 1000000000".
Result<CellSpec> ParseCellSpec(const nlohmann::json& spec);

/// As above from JSON text. Errors: INVALID_ARGUMENT when it is not a JSON object.
Result<CellSpec> ParseCellSpecJson(std::string_view spec_json);

/// The frozen spec as JSON: every member, runtime.cuda and runtime.gpu_model only when set
/// (so a cell without those pins keeps the id it had before they existed).
nlohmann::json CellSpecToJson(const CellSpec& spec);

/// The topology as the frozen spec writes it: {"tp", "dp", "pp", "ep"} always, "dp_shard",
/// "cp" and "etp" only when not 1 (REST renders it the same way).
nlohmann::json TopologyJson(const CellSpec::Topology& topology);
/// "tp=2 dp=1 pp=1 ep=1", then " dp_shard=N", " cp=N", " etp=N" for those not 1: the
/// topology in reports, matrix column keys and reasons.
std::string TopologyText(const CellSpec::Topology& topology);

/// The canonical serialisation of the frozen spec (keys sorted, no whitespace): the text
/// whose SHA-256 is the cell id.
std::string CanonicalSpecJson(const CellSpec& spec);

/// What the controller knows when it reads a submit body.
struct SubmitContext {
  std::string torch_pin = "2.11.0";  // the default runtime.torch (--torch-pin)
  /// The default runtime.transformers of reference cells (--transformers-pin).
  std::string transformers_pin = "5.24.0";
};

/// A submit body (docs/protocols.md §1) after validation: the spec with every default filled
/// (commit as given or empty, digests empty) and the members that are not the spec's.
struct SubmitRequest {
  CellSpec spec;
  /// A validation body that names no reference: the controller finds or creates the reference
  /// cell `ReferenceCellFor(spec, reference_prompts)` and sets spec.reference.cell to its id.
  bool auto_reference = false;
  std::vector<Prompt> reference_prompts;  // the body's `prompts`, for that reference cell
  std::string branch;  // empty when only a commit was given
  int priority = 0;    // scheduling only; never in the spec
};

/// Parses and validates a submit body: types, values and limits only (no filesystem or git).
/// Errors: INVALID_ARGUMENT naming the field and the offending value, e.g. "unknown field
/// 'foo'", "field 'topology.tp': expected an integer from 1 to 64, got \"2\""; arrays and
/// objects nested deeper than 64 levels are refused. Messages are valid UTF-8.
Result<SubmitRequest> ParseSubmitBody(std::string_view body, const SubmitContext& context);

/// The reference cell a validation cell `spec` compares with when it names no reference: the
/// same checkpoint, device, torch pin, decode length and training knobs, `prompts`, and the
/// transformers pin of `context`. Its digest fields are the validation cell's.
CellSpec ReferenceCellFor(const CellSpec& spec, const std::vector<Prompt>& prompts,
                          const SubmitContext& context);

/// A submit body that reproduces the cell of `spec` (names the commit, not the branch).
nlohmann::json ReproduceBody(const CellSpec& spec);

/// True when a GPU of model `gpu_model` ("NVIDIA H200", as nvidia-smi names it) satisfies the
/// pin `pin` ("H200"): `pin` is a case-insensitive substring. An empty pin matches every GPU.
/// The scheduler and the agent both match with this.
bool GpuModelMatches(std::string_view gpu_model, std::string_view pin);

}  // namespace gatehouse
