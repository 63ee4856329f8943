// Placement of queued attempts on agents. Pure logic over an in-memory view: no I/O, no
// clock; the caller persists the decisions (Store::LeaseAttempts).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/cell_spec.h"
#include "controller/memory_estimate.h"
#include "controller/records.h"

namespace gatehouse::controller {

/// What an attempt needs from an agent, read from its cell's frozen spec.
struct Demand {
  bool gpu = false;     // runtime.device == "cuda": one GPU per rank
  int world_size = 1;   // topology tp x dp x pp: worker ranks
  std::string torch;    // runtime.torch, the pinned torch version ("2.11.0")
  std::string cuda;     // runtime.cuda, the pinned CUDA version ("13.0"); empty: not pinned
  std::string gpu_model;  // runtime.gpu_model ("H200"); empty: any GPU
  /// A reference cell: only an agent that runs upstream with this transformers version
  /// (runtime.transformers) takes it.
  std::string transformers;
  /// Cells that must PASS before this one runs: its reference cell and its control (the
  /// dispatcher holds it back until they have, scheduler.h never sees it before).
  std::vector<std::string> waits_for;
  /// The reference cell among them (reference.cell), whose bundle goes with the assignment.
  std::string reference_cell;
  /// Non-empty: the cell's stored spec does not parse (ParseCellSpec's error); no agent takes
  /// it, and its waiting reason says why.
  std::string invalid;
  /// Memory its processes need (controller/memory_estimate.h); empty: not known, not checked.
  MemoryEstimate memory;
};

/// Memory of an agent's node the scheduler leaves to the system and the agent itself.
inline constexpr int64_t kNodeMemoryReserve = int64_t{1} << 30;

/// The demand of a cell spec, with the memory estimate when known.
Demand DemandOf(const CellSpec& spec, MemoryEstimate memory = {});

/// The demand of a stored frozen spec (docs/protocols.md §2), read with ParseCellSpecJson; a
/// spec that does not parse gives a demand that fits no agent, with `invalid` set.
Demand DemandOfSpec(std::string_view spec_json);

/// An agent as the scheduler sees it.
struct AgentView {
  std::string agent_id;
  int slots = 1;    // attempts it runs at once (Capabilities.slots; <= 0 means 1)
  int running = 0;  // attempts currently leased to it or running on it
  int gpus = 0;          // GPUs it reported (Capabilities.gpus)
  int gpus_in_use = 0;   // GPUs its leased or running CUDA attempts hold (one per rank)
  /// The torch version its worker runs (Capabilities.torch_version); empty: not reported, so
  /// not matched against pins (the identity gate still BLOCKs a mismatch on the node).
  std::string torch_version;
  /// The CUDA its worker's LibTorch is built with (Capabilities.cuda_version); empty: not
  /// reported (an agent that reports none cannot take a cell pinning CUDA).
  std::string cuda_version;
  /// Non-empty: the agent drains (its cleanup check failed) and takes nothing; says why.
  std::string drain_reason;
  /// Its lane label ("cpu", "gpu", "npu"; Capabilities.labels["lane"]); empty: unknown.
  std::string lane;
  /// The model of each of its GPUs (Capabilities.gpus[].model), e.g. "NVIDIA H200".
  std::vector<std::string> gpu_models;
  /// The transformers version its reference runner has (Capabilities.transformers_version);
  /// empty: it runs no reference cells.
  std::string transformers_version;
  /// Its node's memory (Capabilities.memory_bytes, MemTotal); 0: not reported, not checked.
  int64_t memory_bytes = 0;
  /// What the memory estimates of its leased and running attempts add up to.
  int64_t memory_in_use = 0;
  /// Memory of its smallest GPU (Capabilities.gpus[].memory_bytes); 0: not reported.
  int64_t gpu_memory_bytes = 0;
};

/// Why a cell with `estimate` can never run on an agent whose node has `memory_bytes` and
/// whose smallest GPU has `gpu_memory_bytes` (0: not known): e.g. "needs ~44.0 GB of host
/// memory (reference runner ~44.0 GB), the node has 25.3 GB (24.2 GB usable)"; empty when it
/// fits an idle agent. Used by the scheduler and by submit's admission check.
std::string MemoryMisfit(const MemoryEstimate& estimate, int64_t memory_bytes,
                         int64_t gpu_memory_bytes);

/// Limits the scheduler applies beyond fit (controller flags).
struct SchedulingPolicy {
  /// At most this many leased or running attempts per repository; 0: no limit
  /// (--max-running-per-repository).
  int max_running_per_repository = 0;
};

/// Leased and running attempts per repository and per submitter, before this round.
struct RunningLoad {
  std::map<std::string, int> by_repository;
  std::map<std::string, int> by_submitter;
};

/// One decision: run `attempt_id` on `agent_id`.
struct Placement {
  int64_t attempt_id = 0;
  std::string cell_id;
  std::string agent_id;
};

/// A queued attempt no agent could take in this round, and why (one clause per agent, e.g.
/// "gpu-1: 1 of 4 GPUs free, needs 2"; "no agent connected").
struct Waiting {
  int64_t attempt_id = 0;
  std::string reason;
};

/// Places queued attempts. Order: higher priority first; within a priority, fair across
/// submitters (the next attempt comes from the submitter with the fewest attempts leased or
/// running, counting this round's placements; ties: the submitter whose oldest queued attempt
/// is older); within a submitter, first-in first-out (`queue` is oldest first).
///
/// An attempt fits an agent that is not draining, with a free slot, whose torch version equals
/// the attempt's pin (when both are known), whose CUDA version equals the attempt's CUDA pin
/// (when the cell pins one) and, for a CUDA attempt, with at least world_size free GPUs (of
/// the pinned model when the cell pins one: a case-insensitive substring of the agent's GPU
/// model, "H200" matches "NVIDIA H200"), whose node's memory less kNodeMemoryReserve and less
/// what its running attempts' estimates hold covers the attempt's host estimate and whose
/// smallest GPU its per-GPU estimate (each when both are known); and only while its repository is under
/// policy.max_running_per_repository. Among fitting agents a CPU attempt prefers lane "cpu"
/// agents (GPU nodes stay free for GPU work), then the most free slots, then the earlier agent
/// in `agents`. An attempt that fits no agent stays queued (listed in `waiting` with why, when
/// given) without holding back later ones, except that one which would fit an agent with a
/// free slot but for the memory that agent's running attempts hold holds that agent (the one
/// with the most memory): no later attempt of the round is placed there, so a stream of small
/// cells cannot keep a large one waiting forever. Deterministic for equal inputs.
std::vector<Placement> Schedule(const std::vector<QueuedAttempt>& queue,
                                const std::vector<AgentView>& agents,
                                std::vector<Waiting>* waiting = nullptr,
                                const SchedulingPolicy& policy = {},
                                const RunningLoad& load = {});

/// As above, with each queued attempt's demand given (`demands[i]` is queue[i]'s; the
/// controller caches them by cell, specs never change) instead of parsed from its spec_json.
std::vector<Placement> Schedule(const std::vector<QueuedAttempt>& queue,
                                const std::vector<Demand>& demands,
                                const std::vector<AgentView>& agents,
                                std::vector<Waiting>* waiting = nullptr,
                                const SchedulingPolicy& policy = {},
                                const RunningLoad& load = {});

}  // namespace gatehouse::controller
