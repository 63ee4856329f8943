// The parallel gate (gates.h ParallelGate): the cell's topology as a device mesh
// (common/mesh.h), checked against a single-rank control one dimension at a time. Each
// dimension's check lives in files of its own (tp_parity.cc, dp_parity.cc, pp_parity.cc;
// parallel_internal.h lists them), and dp, dp_shard, cp and any of them with tp or ep are the
// data-parallel check (with tensor-parallel replicas, experts split over dp_shard ranks, each
// share's packing split over the cp ranks: cp_batch.cc), and pp alone or with tp is the
// pipeline check; a dimension without a check, or pp with another, BLOCKs the gate, naming
// them. Measured only (GateContext::parallel_measure_only), the pipeline and data-parallel
// checks train the layout without the control and end SKIPPED with their step times.
#include <set>

#include "../gates_internal.h"
#include "common/cell_spec.h"
#include "common/mesh.h"
#include "gatehouse/worker/distributed.h"
#include "gatehouse/worker/gates.h"
#include "parallel_internal.h"

namespace gatehouse::worker {

namespace {

/// The dimensions a check exists for: a mesh that enables any other is BLOCKED.
const std::set<std::string>& CheckedDimensions() {
  static const std::set<std::string> checked = {"tp", "dp_replicate", "dp_shard", "pp", "ep",
                                                 "cp"};
  return checked;
}

}  // namespace

GateOutcome ParallelGate(GateContext& ctx) {
  GateOutcome out;
  const CellSpec::Topology& topo = ctx.spec.topology;
  out.Count("world_size", topo.world_size());
  out.Count("tp", topo.tp);
  const std::string topo_text = "topology " + TopologyText(topo);
  // A frozen spec is not held to the mesh rules (cells stored before them keep reading): a
  // mesh the ranks cannot form is named here.
  Result<Mesh> mesh = Mesh::Make(topo.mesh_shape(), CellSpecLimits::kMaxWorldSize);
  if (!mesh.ok()) return out.Blocked(topo_text + ": " + mesh.status().message());
  if (topo.world_size() == 1 && !ctx.parallel_measure_only) {
    return out.Skipped(topo_text + ": world size 1, nothing to compare against TP=1");
  }
  out.Text("mesh", mesh->ToString());
  std::vector<std::string> unchecked;
  for (const std::string& dim : mesh->EnabledNames()) {
    if (!CheckedDimensions().count(dim)) unchecked.push_back(dim);
  }
  if (!unchecked.empty()) {
    std::string names;
    for (const std::string& d : unchecked) names += (names.empty() ? "" : ", ") + d;
    return out.Blocked(topo_text + ": no check for " + names + " yet (tensor, data (dp, " +
                       "dp_shard), context, expert and pipeline parallelism have one)");
  }
  if (topo.ep > 1 && topo.dp_shard * topo.cp == 1) {
    return out.Blocked(topo_text + ": expert parallelism is checked over ranks of dp_shard x cp " +
                       "(etp=tp); ep=" + std::to_string(topo.ep) + " borrowing tp ranks (etp=1) " +
                       "has no check yet");
  }
  if (topo.pp > 1 && !(mesh->EnabledNames().size() == 1 ||
                       (mesh->EnabledNames().size() == 2 && topo.tp > 1))) {
    std::string names;
    for (const std::string& d : mesh->EnabledNames()) names += (names.empty() ? "" : " x ") + d;
    return out.Blocked(topo_text + ": pipeline parallelism is checked alone and with tp so " +
                       "far, not in the combined layout " + names);
  }
  if (ctx.world_size != topo.world_size()) {
    return out.Blocked(topo_text + " needs " + std::to_string(topo.world_size()) +
                       " worker ranks, but this worker runs as rank " + std::to_string(ctx.rank) +
                       " of " + std::to_string(ctx.world_size) +
                       " (WORLD_SIZE; the agent starts one worker per rank)");
  }
  if (!ctx.comm) {
    return out.Blocked("rank " + std::to_string(ctx.rank) + " of " +
                       std::to_string(ctx.world_size) + " has no process group (joining it failed)");
  }
  // The backend follows the device (worker_main): gloo for CPU tensors, NCCL for CUDA ones.
  const std::string want_backend = ctx.device.is_cuda() ? "nccl" : "gloo";
  if (ctx.comm_backend != want_backend) {
    return out.Blocked("device " + ctx.device.str() + " needs a " + want_backend +
                       " group but this rank joined " +
                       (ctx.comm_backend.empty() ? std::string("none") : ctx.comm_backend) +
                       (ctx.device.is_cuda() && !NcclGroupsAvailable()
                            ? " (this worker was built without c10d's NCCL backend)"
                            : ""));
  }
  out.Text("process_group", ctx.comm_backend);
  if (ctx.parallel_measure_only) {
    // The layout's memory is its own: the reference is read first, the model the earlier
    // phases loaded (every rank's, whole; no check uses it) is released, and the peak runs
    // from here (the benchmark requests no phase after this one). The checkpoint's pages the
    // load adopted stay mapped (the checks load from them): they are in the start figure.
    GateOutcome scratch;
    internal::RequireReference(ctx, scratch);  // its problem, if any, is the check's to report
    ctx.model.reset();
    ctx.model_loaded = false;
    internal::ReturnFreedMemory();
    internal::ResetPeakRss();
    if (std::optional<int64_t> rss = internal::ReadResidentMemory().current_bytes) {
      out.Bytes("rss_layout_start_bytes", *rss);
    }
  }
  // Data parallelism forms its groups from the mesh; tensor parallelism alone is the world.
  if (topo.pp > 1) return parallel::PipelineParallelParity(ctx, *mesh, std::move(out));
  // Data parallelism (dp, dp_shard or both) and context parallelism, with or without tp, are
  // one check; measured only, it trains tp alone and the whole model alone (world size 1) too.
  if (topo.dp > 1 || topo.dp_shard > 1 || topo.cp > 1 || ctx.parallel_measure_only) {
    return parallel::DataParallelParity(ctx, *mesh, std::move(out));
  }
  return parallel::TensorParallelParity(ctx, topo.tp, std::move(out));
}

}  // namespace gatehouse::worker
