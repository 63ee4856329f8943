// Context parallelism in the data-parallel check (dp_run.h): each data-parallel share packed
// into one row, as RL and SFT trainers pack variable-length sequences, and cut into cp
// contiguous parts, one per rank of the cp group (torchtitan's and Archon's sequence sharding
// without load balancing). The model runs its packed forward over the cp group
// (CausalLM::ForwardPackedContextParallel: Ulysses' all-to-all inside attention), each rank
// computing the cross entropy of its own columns against labels shifted over the whole
// packing (the last column of a rank predicts the first token of the next rank's columns).
// The positions each rank passes are those of the whole packing: a sequence that began on an
// earlier rank goes on counting (DpReduction::kCpLocalPositions is the bug where it does not).
#include <algorithm>

#include "../gates_internal.h"
#include "dp_run.h"

namespace gatehouse::worker::parallel {

namespace {

/// The sequences (d, d + dp, ...) of `batch` at data-parallel index d.
std::vector<size_t> ShareIndices(size_t batch, int64_t dp, int64_t d) {
  std::vector<size_t> indices;
  for (size_t i = static_cast<size_t>(d); i < batch; i += static_cast<size_t>(dp)) indices.push_back(i);
  return indices;
}

/// This rank's columns [c L, (c + 1) L) of `packing` (c its index in the cp group): tokens,
/// positions [1, L] and labels [L]. Under kCpLocalPositions the positions restart at this
/// rank's first column.
Packing Columns(const DpRun& run, const Packing& packing) {
  const int64_t c = run.cp_comm->rank();
  const int64_t columns = packing.tokens.size(1) / run.cp;
  Packing mine;
  mine.tokens = packing.tokens.slice(1, c * columns, (c + 1) * columns);
  mine.positions = packing.positions.slice(1, c * columns, (c + 1) * columns);
  mine.labels = packing.labels.slice(0, c * columns, (c + 1) * columns);
  mine.cu_seqlens = packing.cu_seqlens;
  if (run.reduction.mode == DpReduction::Mode::kCpLocalPositions) {
    // A sequence that starts in these columns keeps its numbering; one that began on an
    // earlier rank restarts at this rank's first column.
    const torch::Tensor local = torch::arange(columns, mine.positions.options()).unsqueeze(0);
    mine.positions = torch::minimum(mine.positions, local);
  }
  return mine;
}

}  // namespace

Packing PackShare(const std::vector<torch::Tensor>& share, torch::Device device) {
  std::vector<torch::Tensor> inputs, labels;
  for (const torch::Tensor& ids : share) {
    const int64_t t = ids.size(0) - 1;  // predicted tokens
    inputs.push_back(ids.slice(0, 0, t));
    labels.push_back(ids.slice(0, 1, t + 1));
  }
  internal::Packed packed = internal::Pack(inputs, device);  // the packing gate's
  return {packed.tokens, packed.positions, torch::cat(labels).to(device), packed.cu_seqlens};
}

int64_t TrimForContextParallel(std::vector<torch::Tensor>& batch, int64_t dp, int64_t cp,
                               std::string& why) {
  int64_t trimmed = 0;
  std::vector<bool> dropped(batch.size(), false);
  for (int64_t d = 0; d < dp; ++d) {
    std::vector<size_t> share = ShareIndices(batch.size(), dp, d);
    int64_t columns = 0;
    for (size_t i : share) columns += batch[i].size(0) - 1;
    while (columns % cp != 0) {
      const int64_t cut = columns % cp;
      const auto by_length = [&](size_t a, size_t b) { return batch[a].size(0) < batch[b].size(0); };
      const size_t longest = *std::max_element(share.begin(), share.end(), by_length);
      if (batch[longest].size(0) - cut >= 2) {
        // Shorten the longest sequence by the excess.
        batch[longest] = batch[longest].slice(0, 0, batch[longest].size(0) - cut);
        columns -= cut;
        trimmed += cut;
        continue;
      }
      // Every sequence is too short to give up `cut` tokens: leave out the shortest whole
      // (the share keeps at least one). Only with one share: dropping a sequence would move
      // the later ones to other shares.
      if (share.size() < 2 || dp > 1) {
        why = "data-parallel share " + std::to_string(d) + " packs " + std::to_string(columns) +
              " columns in " + std::to_string(share.size()) + " sequence(s), none long enough " +
              "to give up " + std::to_string(cut) + " token(s) and keep 2";
        return -1;
      }
      const auto shortest = std::min_element(share.begin(), share.end(), by_length);
      columns -= batch[*shortest].size(0) - 1;
      trimmed += batch[*shortest].size(0);
      dropped[*shortest] = true;
      share.erase(shortest);
    }
    if (columns < cp) {
      why = "data-parallel share " + std::to_string(d) + " packs " + std::to_string(columns) +
            " column(s), fewer than cp";
      return -1;
    }
  }
  std::vector<torch::Tensor> kept;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!dropped[i]) kept.push_back(batch[i]);
  }
  batch = std::move(kept);
  return trimmed;
}

double ContextParallelBackward(DpRun& run, const std::vector<torch::Tensor>& share,
                               double normalizer) {
  const Packing mine = Columns(run, PackShare(share, run.ctx.device));
  const ContextParallel cp{run.cp_comm->rank(), run.cp, run.cp_comm};
  const torch::Tensor logits =
      run.model->ForwardPackedContextParallel(mine.tokens, mine.positions, mine.cu_seqlens, cp)
          .to(torch::kFloat);
  const torch::Tensor loss =
      torch::nn::functional::cross_entropy(
          logits.view({-1, logits.size(-1)}), mine.labels,
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
      normalizer;
  loss.backward();
  return loss.item<double>();
}

std::string CompareContextParallelLogits(DpRun& run) {
  try {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> share;
    for (size_t i : ShareIndices(run.batch.size(), run.dp, run.dp_index)) share.push_back(run.batch[i]);
    const Packing whole = PackShare(share, run.ctx.device);
    const Packing mine = Columns(run, whole);
    const ContextParallel cp{run.cp_comm->rank(), run.cp, run.cp_comm};
    const torch::Tensor ours = run.model->ForwardPackedContextParallel(
        mine.tokens, mine.positions, mine.cu_seqlens, cp);
    const std::vector<torch::Tensor> parts = run.cp_comm->AllGather(ours[0].to(torch::kFloat).contiguous());
    if (!run.rank0) return "";
    const torch::Tensor control =
        run.control->ForwardPacked(whole.tokens, whole.positions, whole.cu_seqlens);
    run.cp_vs_packed.Add(control[0].to(torch::kFloat).cpu(), torch::cat(parts, 0).cpu());
  } catch (const std::exception& e) {
    return std::string("context-parallel forward: ") + e.what();
  }
  return "";
}

}  // namespace gatehouse::worker::parallel
