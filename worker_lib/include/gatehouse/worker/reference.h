// The reference bundle: upstream (transformers) outputs on the probe prompts, made by
// tools/refgen (make_checkpoint.py make_reference) and compared against by the inference,
// decode, training, parallel and cuda_graph gates. Format gatehouse-reference/2
// (docs/protocols.md §6).
//
// A bundle is a directory with
//   reference.json        {"format": "gatehouse-reference/2", "training": {...}, ...}; optional
//                         "prompts" (array, one entry per prompt) or "num_prompts" (integer)
//                         fixes the prompt count
//   reference.safetensors for each prompt i, each run r of {"" (fp32), "_bf16"}:
//     prompts.{i}.input_ids              I64 [T]     prompt token ids (T >= 1)
//     prompts.{i}.logits{r}              F32 [T, V]  upstream logits of every prompt position
//     prompts.{i}.greedy_ids{r}          I64 [N]     upstream greedy continuation (new tokens)
//     prompts.{i}.decode_logits{r}       F32 [N, V]  the logits upstream's KV-cached decode
//                                                    chose greedy_ids{r}[k] from (row k)
//     prompts.{i}.continuation_logits{r} F32 [N, V]  teacher-forced: one forward over the prompt
//                                                    and greedy_ids{r}[0..N-2], the rows that
//                                                    predict greedy_ids{r}
// The fp32 run is the checkpoint loaded in float32, the bf16 run the checkpoint loaded by
// from_pretrained(dtype=bfloat16) (weights and compute in bf16). Without "prompts" /
// "num_prompts" the count is the number of consecutive i from 0 for which
// prompts.{i}.input_ids exists.
//
// reference.json "training": upstream's AdamW steps on the probe prompts (step s trains on
// prompt (s - 1) mod P: inputs ids[:-1], labels ids[1:], mean cross-entropy):
//   {"steps": S, "lr": x, "seed": n, "optimizer": "...", "batch": "...",
//    "fp32": TRACE, "bf16": TRACE}
//   TRACE = {"losses": [S numbers], "grad_norms": {"<checkpoint key>": L2 norm of its gradient
//            at step 1}, "grad_sums": {"<checkpoint key>": sum of that gradient}, "trainable": ["<checkpoint key>", ...], "first_changed_step":
//            {"<checkpoint key>": first step after which the weight differs, or null},
//            "floor": {"implementations": [...], "grad_norm_rel": x, "loss_rel": [S numbers]}}
// reference.json "decode_floor": {"fp32": {"max_abs_diff", "kl_mean", "steps"}, "bf16": {...}}:
// upstream's dynamic-cache decode logits against its static cache's.
// Where the forwards ran: "device" ("cpu" when absent), and on the CPU "cpu_capability" (the
// kernel family torch dispatched to, torch.backends.cpu.get_cpu_capability()) and
// "num_threads".
// reference.json "envelope" (optional): the envelope of correct implementations per precision
// (envelope.h, tools/refgen/envelope.py).
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "gatehouse/worker/envelope.h"

namespace gatehouse::worker {

/// Format tag reference.json must carry.
inline constexpr std::string_view kReferenceFormat = "gatehouse-reference/2";

/// One precision's upstream run on one prompt. CPU tensors.
struct ReferenceRun {
  torch::Tensor logits;               // float32 [T, V]
  torch::Tensor greedy_ids;           // int64 [N]
  torch::Tensor decode_logits;        // float32 [N, V]
  torch::Tensor continuation_logits;  // float32 [N, V]
};

struct ReferencePrompt {
  torch::Tensor input_ids;  // int64 [T], CPU
  ReferenceRun fp32;
  ReferenceRun bf16;
  /// The run a cell of `precision` ("bf16" or "fp32") compares with.
  const ReferenceRun& For(std::string_view precision) const {
    return precision == "bf16" ? bf16 : fp32;
  }
};

/// Upstream's training steps in one precision (reference.json "training"."fp32" / ."bf16").
struct TrainingTrace {
  std::vector<double> losses;                 // nats, one per step
  std::map<std::string, double> grad_norms;   // checkpoint key -> L2 norm at step 1
  /// checkpoint key -> sum of its step-1 gradient's elements (sign-sensitive, unlike the norm)
  std::map<std::string, double> grad_sums;
  std::vector<std::string> trainable;         // checkpoint keys upstream trains
  /// checkpoint key -> the first step after which upstream's weight differs from the
  /// checkpoint's; 0 when it never did within the trace (a bf16 update below half an ulp
  /// rounds away).
  std::map<std::string, int64_t> first_changed_step;
  /// Upstream's own spread ("floor"): the same trace made with its other implementations of the
  /// same math (MoE experts loops), against this one; 0 where upstream has none.
  std::vector<std::string> floor_implementations;
  double floor_grad_norm_rel = 0;     // max over keys of the relative step-1 norm difference
  std::vector<double> floor_loss_rel;  // per step, relative loss difference
};

/// Upstream's own spread between its dynamic and static KV caches, over the decode steps
/// whose tokens agreed (reference.json "decode_floor"."<precision>").
struct DecodeFloor {
  double max_abs_diff = 0;  // logits
  double kl_mean = 0;       // nats per step
  int64_t steps = 0;
};

/// reference.json "training".
struct TrainingReference {
  int64_t steps = 0;
  double lr = 0;
  int64_t seed = 0;
  std::string optimizer;  // as upstream's trace describes it
  TrainingTrace fp32, bf16;
  const TrainingTrace& For(std::string_view precision) const {
    return precision == "bf16" ? bf16 : fp32;
  }
};

struct ReferenceBundle {
  std::filesystem::path dir;
  nlohmann::json meta;  // reference.json as read
  std::vector<ReferencePrompt> prompts;
  int64_t vocab_size = 0;      // V, equal across prompts
  int64_t max_new_tokens = 0;  // N, equal across prompts and runs
  TrainingReference training;
  DecodeFloor decode_floor_fp32, decode_floor_bf16;
  const DecodeFloor& DecodeFloorFor(std::string_view precision) const {
    return precision == "bf16" ? decode_floor_bf16 : decode_floor_fp32;
  }
  /// Where upstream ran: reference.json "device" ("cpu" when absent), "cpu_capability" and
  /// "num_threads" ("" / 0 when absent).
  std::string device = "cpu";
  std::string cpu_capability;
  int64_t num_threads = 0;
  /// reference.json "envelope" (envelope.h): upstream's spread under the choices a correct
  /// implementation may make; empty for a bundle that holds none.
  Envelopes envelope;
};

/// Reads and validates a bundle: the format tag, at least one prompt, every tensor above
/// present with its dtype and rank, logits rows == input_ids length, decode and continuation
/// rows == greedy_ids length, one V and one N >= 1 for all (and "max_new_tokens", when given,
/// equal to N; "num_prompts", when given with "prompts", equal to its length), token ids
/// inside [0, V), finite logits, and the training traces (S losses each, a norm per trainable
/// key). Other tensors and fields are ignored.
/// Errors: NOT_FOUND (directory, file or tensor missing), INVALID_ARGUMENT / DATA_LOSS naming
/// the file, the field or the tensor, and the offending value.
Result<ReferenceBundle> LoadReference(const std::filesystem::path& dir);

}  // namespace gatehouse::worker
