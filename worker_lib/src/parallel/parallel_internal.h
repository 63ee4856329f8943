// What the parallel gate's checks share (worker_lib/src/parallel): collectives that let every
// rank agree on a problem before the next collective, the spread of one tensor across ranks,
// and the pieces of a save comparison. Internal to the SDK.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/artifacts.h"
#include "common/status.h"
#include "gatehouse/worker/gates.h"

namespace gatehouse::worker::parallel {

/// Every rank's `problem` ("" when none) gathered, the same on every rank: "" when no rank has
/// one, else "rank r: <problem>; ..." in rank order. Each is cut to 600 bytes (an adapter's
/// traceback can be long). A collective: every rank calls it, so a rank's failure is never
/// left for the others to wait on, and rank 0's verdict names every rank's cause.
std::string RankProblems(TpCommunicator& comm, const std::string& problem);

/// Folds into (max_diff, max_rel) how far each rank's copy in `copies` (one per rank, same
/// shape) is from rank 0's: max abs difference, and that relative to rank 0's max abs.
void RankSpread(const std::vector<torch::Tensor>& copies, double& max_diff, double& max_rel);

/// A load report's problems (missing, unexpected, unknown, shape, non-finite, loaded twice),
/// the first few joined.
std::string LoadProblems(const LoadReport& rep);

/// Writes `tensors` to `attempt_dir`/`rel_dir`/model.safetensors as the artifact `name`
/// (its path relative to the attempt). Errors: INTERNAL when the directory cannot be made,
/// or the writer's.
Result<Artifact> WriteCheckpoint(const std::filesystem::path& attempt_dir,
                                 const std::string& rel_dir,
                                 const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                 const std::string& name);

/// Cross entropy of next-token prediction on `ids` [T] int64 (T >= 2), in fp32: the loss the
/// parallel checks train one step on.
torch::Tensor NextTokenLoss(CausalLM& model, const torch::Tensor& ids, torch::Device device);

/// The whole checkpoint into `model` (every parameter, unsharded): through the adapter's code
/// when the family maps weights by code (the Python lane), else through its name table.
Result<LoadReport> LoadFull(const GateContext& ctx, CausalLM& model);

/// What every parallel check needs before its first collective: model args (config), a
/// checkpoint and a name table or weights mapped by code (load), the reference bundle. Returns
/// "" when all are there, else why not; `blocked` is set when the reason is an input the cell
/// cannot change by running again (RequireReference's BLOCKED).
std::string NotReady(GateContext& ctx, bool& blocked);

/// The tensor-parallel check: the mesh's TP group (the whole world: no other dimension is
/// enabled) against the TP=1 control on rank 0, on the reference prompts (tp_parity.cc).
/// `out` holds the figures ParallelGate recorded; every rank calls it together.
GateOutcome TensorParallelParity(GateContext& ctx, int64_t tp_size, GateOutcome out);

/// How the data-parallel check reduces gradients over the dp group. The gate runs kSum; the
/// others are the bugs the check must catch, run by its tests (tests/models/parallel_dp_test.cc).
struct DpReduction {
  enum class Mode {
    kSum,        // each rank's loss divided by the global token count, gradients summed in fp32
    kAverage,    // as kSum, then the gradients divided by dp
    kLocalMean,  // each rank's own token mean, gradients averaged over dp (DDP's default)
    kNone,       // no all-reduce: each rank steps on its own gradients
  };
  Mode mode = Mode::kSum;
  /// In words, for the evidence.
  std::string Name() const;
};

/// The data-parallel check: the mesh's dp_replicate group (the whole world: no other dimension
/// is enabled) trained two AdamW steps on the reference prompts split over the ranks, against
/// the single-rank control on the whole batch on rank 0 (dp_parity.cc). BLOCKED when the
/// bundle has fewer prompts of 2 tokens or more than dp. `out` holds the figures ParallelGate
/// recorded; every rank calls it together.
GateOutcome DataParallelParity(GateContext& ctx, int64_t dp, GateOutcome out,
                               const DpReduction& reduction = {});

}  // namespace gatehouse::worker::parallel
