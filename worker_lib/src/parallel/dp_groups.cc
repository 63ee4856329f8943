// The data-parallel check's process groups (dp_run.h FormGroups): the data-parallel groups,
// the cp and tp groups, and the expert-parallel ones, each joined through the mesh
// (parallel_support.cc MeshGroup), and the family's tp plan for dp x tp.
#include <algorithm>
#include <map>

#include "dp_run.h"

namespace gatehouse::worker::parallel {

namespace {

/// The enabled dimensions among `dims`; {dims[0]} when none is.
std::vector<Mesh::Dim> Enabled(const DpRun& run, const std::vector<Mesh::Dim>& dims) {
  std::vector<Mesh::Dim> on;
  for (Mesh::Dim d : dims) {
    if (run.mesh.Enabled(d)) on.push_back(d);
  }
  return on.empty() ? std::vector<Mesh::Dim>{dims.front()} : on;
}

/// The data-parallel ranks that hold `rank`'s experts: those at `rank`'s place in their own
/// EP group (`rank` first among equals: in rank order).
std::vector<int64_t> SameExperts(const DpRun& run, int64_t rank) {
  auto place = [&](int64_t r) {
    const std::vector<int64_t> g = run.mesh.ExpertGroupOf(r);
    return std::find(g.begin(), g.end(), r) - g.begin();
  };
  std::vector<int64_t> same;
  for (int64_t r : run.mesh.GroupOf(rank, DataDims(run))) {
    if (place(r) == place(rank)) same.push_back(r);
  }
  return same;
}

/// Joins this rank's EP group (Mesh::ExpertGroupOf) and, when other data-parallel ranks hold
/// the same experts, their group; for a family that shards by its own code, records the
/// world's groups it is handed (run.expert_groups). Returns this rank's problem; `blocked` for
/// a layout the check has no plan for.
std::string FormExpertGroups(DpRun& run, bool& blocked) {
  GateContext& ctx = run.ctx;
  const MeshShape& shape = run.mesh.shape();
  if (ctx.family->MapsWeightsByCode() && !ctx.family->ShardsLoadedModel()) {
    blocked = true;
    return "ep=" + std::to_string(run.ep) + ": the family maps weights by code and gives no " +
           "parallelize (ModelFamily::ShardsLoadedModel)";
  }
  if (shape.tp > 1 && shape.etp == 1) {
    blocked = true;
    return "ep=" + std::to_string(run.ep) + " with etp=1 and tp=" + std::to_string(shape.tp) +
           " (whole experts over ranks of the tp groups) has no check yet; etp=tp has one";
  }
  if (ctx.family->ShardsLoadedModel()) {
    // The adapter's expert_parallel splits its experts over the groups it is handed and says
    // itself whether ep divides them.
    run.expert_groups.ep = run.mesh.ExpertGroups();
    std::vector<bool> placed(static_cast<size_t>(run.mesh.world_size()), false);
    for (int64_t r = 0; r < run.mesh.world_size(); ++r) {
      if (placed[static_cast<size_t>(r)]) continue;
      run.expert_groups.replicas.push_back(SameExperts(run, r));
      for (int64_t s : run.expert_groups.replicas.back()) placed[static_cast<size_t>(s)] = true;
    }
  }
  // The experts the name table stacks (every stacked parameter is split over ep).
  int64_t experts = 0;
  for (const std::string& hf : ctx.adapter ? ctx.adapter->ExpectedHfNames() : std::vector<std::string>{}) {
    Result<TensorSlot> slot = ctx.adapter->Resolve(hf);
    if (!slot.ok() || slot->slice < 0) continue;
    Result<std::vector<HfSlice>> slices = ctx.adapter->HfSlices(slot->internal);
    if (slices.ok()) experts = static_cast<int64_t>(slices->size());
    break;
  }
  if (!ctx.family->ShardsLoadedModel() && (experts == 0 || experts % run.ep != 0)) {
    blocked = true;
    return "ep=" + std::to_string(run.ep) +
           (experts == 0
                ? std::string(": this model has no experts (no stacked parameter in its name table)")
                : " does not divide the model's " + std::to_string(experts) + " experts");
  }
  if (!ctx.subgroups) return "the EP group needs sub-groups, which this rank's process group lacks";
  auto ranks_text = [](const std::vector<int64_t>& ranks) {
    std::string t;
    for (int64_t r : ranks) t += (t.empty() ? "" : ",") + std::to_string(r);
    return t;
  };
  const std::vector<int64_t> ep_ranks = run.mesh.ExpertGroupOf(ctx.rank);
  Result<std::shared_ptr<TpCommunicator>> ep = ctx.subgroups->Join("ep", ep_ranks);
  if (!ep.ok()) return "EP group [" + ranks_text(ep_ranks) + "]: " + ep.status().message();
  run.ep_comm = *ep;
  // The data-parallel ranks at this rank's place in their own EP group hold its experts.
  const std::vector<int64_t> same_experts = SameExperts(run, ctx.rank);
  if (same_experts.size() > 1) {
    Result<std::shared_ptr<TpCommunicator>> dp = ctx.subgroups->Join("dp_mod_ep", same_experts);
    if (!dp.ok()) return "group of the ranks holding the same experts: " + dp.status().message();
    run.expert_dp_comm = *dp;
  }
  // Of those, the ones in this rank's dp_shard (x cp) group shard the experts' optimizer state
  // (FSDP over dp_shard x cp / ep); across replicas the state is replicated, as for dense
  // parameters.
  std::vector<int64_t> shard_peers;
  const std::vector<int64_t> shard_group = run.mesh.GroupOf(ctx.rank, ShardDims(run));
  for (int64_t r : same_experts) {
    if (std::find(shard_group.begin(), shard_group.end(), r) != shard_group.end()) shard_peers.push_back(r);
  }
  if (shard_peers.size() == same_experts.size()) {
    run.expert_shard_comm = run.expert_dp_comm;
  } else if (shard_peers.size() > 1) {
    Result<std::shared_ptr<TpCommunicator>> s = ctx.subgroups->Join("dp_shard_mod_ep", shard_peers);
    if (!s.ok()) return "dp_shard group of the ranks holding the same experts: " + s.status().message();
    run.expert_shard_comm = *s;
  }
  return "";
}

}  // namespace

/// The enabled dimensions the parameters are replicated over and their gradients summed
/// over: dp_replicate, dp_shard and cp (torchtitan's dp_cp; at least one).
std::vector<Mesh::Dim> DataDims(const DpRun& run) {
  return Enabled(run, {Mesh::Dim::kDpReplicate, Mesh::Dim::kDpShard, Mesh::Dim::kCp});
}

/// Those the optimizer state is sharded over: dp_shard and cp (torchtitan's dp_shard_cp, the
/// mesh FSDP shards over).
std::vector<Mesh::Dim> ShardDims(const DpRun& run) {
  return Enabled(run, {Mesh::Dim::kDpShard, Mesh::Dim::kCp});
}

/// Joins the data-parallel groups (flattened, then dp_replicate and dp_shard apart when both
/// are enabled) and the tp group and, for dp x tp, takes the family's plan. Every rank joins
/// in this order, so no group waits on a rank that is joining another. Returns this rank's
/// problem; `blocked` when the cell cannot run this layout whatever happens.
std::string FormGroups(DpRun& run, bool& blocked) {
  GateContext& ctx = run.ctx;
  using Dim = Mesh::Dim;
  // One group per set of dims: a group joined twice would rendezvous twice on one store
  // prefix (the cp group is also the shard group when dp_shard is 1).
  std::map<std::vector<Dim>, std::shared_ptr<TpCommunicator>> joined;
  auto MeshGroup = [&](const GateContext& c, const Mesh& m, const std::vector<Dim>& dims)
      -> Result<std::shared_ptr<TpCommunicator>> {
    if (auto it = joined.find(dims); it != joined.end()) return it->second;
    Result<std::shared_ptr<TpCommunicator>> g = parallel::MeshGroup(c, m, dims);
    if (g.ok()) joined.emplace(dims, *g);
    return g;
  };
  Result<std::shared_ptr<TpCommunicator>> dp = MeshGroup(ctx, run.mesh, DataDims(run));
  if (!dp.ok()) return "data-parallel group: " + dp.status().message();
  run.dp_comm = *dp;
  // The share of the batch: the index over dp_replicate x dp_shard (the cp ranks of a share
  // split its packing).
  const Mesh::Coordinates at = run.mesh.CoordinatesOf(ctx.rank);
  run.dp_index = at[static_cast<int>(Dim::kDpReplicate)] * run.shard + at[static_cast<int>(Dim::kDpShard)];
  const int64_t sharded = run.shard * run.cp;  // dp_shard x cp
  if (run.replicate > 1 && sharded > 1) {
    Result<std::shared_ptr<TpCommunicator>> r = MeshGroup(ctx, run.mesh, {Dim::kDpReplicate});
    if (!r.ok()) return "dp_replicate group: " + r.status().message();
    Result<std::shared_ptr<TpCommunicator>> s = MeshGroup(ctx, run.mesh, ShardDims(run));
    if (!s.ok()) return "dp_shard group: " + s.status().message();
    run.replicate_comm = *r;
    run.shard_comm = *s;
  } else {
    (sharded > 1 ? run.shard_comm : run.replicate_comm) = run.dp_comm;
  }
  if (run.cp > 1) {
    if (ctx.family->MapsWeightsByCode() || ctx.family->ShardsLoadedModel()) {
      blocked = true;
      return "cp=" + std::to_string(run.cp) + ": the family shards by code (the Python lane's " +
             "parallelize), which is handed no context-parallel group yet";
    }
    const nlohmann::json config = ctx.args->ToJson();
    const int64_t heads = config.value("num_attention_heads", int64_t{0});
    if (heads > 0 && (heads % run.tp != 0 || (heads / run.tp) % run.cp != 0)) {
      blocked = true;
      return "cp=" + std::to_string(run.cp) + " does not divide the " + std::to_string(heads) +
             " query heads" + (run.tp > 1 ? " over tp=" + std::to_string(run.tp) : "") +
             " (Ulysses gives each cp rank a share of every tp rank's heads)";
    }
    Result<std::shared_ptr<TpCommunicator>> c = MeshGroup(ctx, run.mesh, {Dim::kCp});
    if (!c.ok()) return "cp group: " + c.status().message();
    run.cp_comm = *c;
  }
  if (run.ep > 1) {
    if (std::string problem = FormExpertGroups(run, blocked); !problem.empty()) return problem;
  }
  // A family that shards a loaded model by its own code (the Python lane: the adapter's
  // parallelize over the replica's tp group, its data_parallel over the data-parallel ranks)
  // takes no plan here.
  run.by_code = ctx.family->ShardsLoadedModel();
  if (run.tp == 1) return "";
  Result<std::shared_ptr<TpCommunicator>> tp = MeshGroup(ctx, run.mesh, {Mesh::Dim::kTp});
  if (!tp.ok()) return "tp group: " + tp.status().message();
  run.tp_comm = *tp;
  if (run.by_code) return "";
  if (ctx.family->MapsWeightsByCode()) {
    blocked = true;
    return "tp=" + std::to_string(run.tp) + ": the family maps weights by code and gives no "
           "parallelize (ModelFamily::ShardsLoadedModel)";
  }
  Result<TpPlan> plan = ctx.family->Parallelize(*ctx.args, run.tp);
  if (!plan.ok()) {
    return "tensor-parallel plan (Parallelize, tp=" + std::to_string(run.tp) +
           "): " + plan.status().message();
  }
  run.plan = std::move(plan).value();
  return "";
}

}  // namespace gatehouse::worker::parallel
