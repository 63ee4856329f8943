// The data-parallel check's save comparison (dp_run.h CompareSave): before any optimizer step,
// the parameters every rank holds (tp shards, its experts, its replica) gathered back into the
// whole model, named as the checkpoint names them, against the single-rank control's save,
// bit for bit. A save from a sharded layout that loses, duplicates or misplaces a slice (an
// expert at the wrong offset, a tp shard in the wrong order) differs here.
#include "../gates_internal.h"
#include "dp_run.h"

namespace gatehouse::worker::parallel {

std::string CompareSave(DpRun& run) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> local;
  for (const ParamGroup& g : run.params) local.push_back(g.tensor.detach());
  std::vector<torch::Tensor> full;
  try {
    full = Full(run, local);
  } catch (const std::exception& e) {
    return std::string("gathering the save: ") + e.what();
  }
  if (!run.rank0) return "";
  std::vector<ParamGroup> gathered = run.params;
  for (size_t i = 0; i < gathered.size(); ++i) gathered[i].tensor = full[i];
  const HfTensors ours = internal::HfNamesOf(run.ctx, gathered);
  const HfTensors control = internal::HfNamesOf(run.ctx, run.control_params);
  if (!ours.ok() || !control.ok()) {
    run.save_problems.push_back(ours.ok() ? control.Problems() : ours.Problems());
    return "";
  }
  run.save_tensors = static_cast<int64_t>(ours.tensors.size());
  run.save_tensors_equal = CompareHfSaves(ours, control, "single-rank", run.save_problems);
  return "";
}

}  // namespace gatehouse::worker::parallel
