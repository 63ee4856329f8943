// The cuda_graph gate (gates.h CudaGraphGate; docs/gate-facts.md "CUDA graphs": vLLM compares
// eager and graph decode for exact token equality). The graph's step logits, fed upstream's
// tokens, are also held to the decode gate's bars against upstream's decode logits.
#include <vector>

#include "gatehouse/worker/bars.h"
#include "gatehouse/worker/cuda_graph.h"
#include "gatehouse/worker/gates.h"
#include "gates_internal.h"

namespace gatehouse::worker {

using internal::Num;
using internal::Positions;

namespace {

/// Batch sizes whose replay speed is measured (each row the first prompt).
constexpr int64_t kSpeedBatchSizes[] = {1, 4, 16};

/// Eager greedy decode of `prompts` [B, T] with the model's KV cache (the same steps as
/// GreedyDecode, batched); returns the mean ms per step after the prefill.
double EagerBatchMsPerToken(CausalLM& model, const torch::Tensor& prompts, int64_t n,
                            torch::Device device) {
  torch::NoGradGuard no_grad;
  const int64_t b = prompts.size(0), t = prompts.size(1);
  auto cache = model.NewKVCache(b, t + n);
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  torch::Tensor logits = model.Forward(prompts.to(device),
                                       torch::arange(t, long_opts).unsqueeze(0).expand({b, t}).contiguous(),
                                       cache.get());
  torch::Tensor next = logits.select(1, t - 1).argmax(-1);
  internal::SyncDevice(device);
  const double t0 = internal::NowMsSteady();
  for (int64_t step = 1; step < n; ++step) {
    logits = model.Forward(next.view({b, 1}), torch::full({b, 1}, t + step - 1, long_opts), cache.get());
    next = logits.select(1, 0).argmax(-1);
  }
  internal::SyncDevice(device);
  const double ms = internal::NowMsSteady() - t0;
  return n > 1 ? ms / double(n - 1) : 0.0;
}

}  // namespace

GateOutcome CudaGraphGate(GateContext& ctx) {
  GateOutcome out;
  if (!ctx.runtime.cuda_available) {
    return out.Skipped("no CUDA device: torch::cuda::is_available() is false");
  }
  if (ctx.spec.mode != "cuda_graph") return out.Skipped("mode eager: CUDA-graph decode not requested");
  if (!internal::RequireLoadedModel(ctx, out) || !internal::RequireReference(ctx, out)) return out;
  if (!ctx.device.is_cuda()) {
    return out.Blocked("runtime.device is " + ctx.device.str() +
                       ": CUDA-graph decode needs the model on a CUDA device");
  }
  CausalLM& model = *ctx.model;
  if (!model.SupportsStaticDecode()) {
    return out.Fail(FailureClass::kAdapterContract,
                    "mode cuda_graph: the model has no static decode step "
                    "(CausalLM::SupportsStaticDecode; dynamic RoPE reads the sequence length, MoE "
                    "routing picks experts on the host)");
  }
  const ReferenceBundle& ref = *ctx.reference;
  const int64_t n = ctx.spec.decode.max_new_tokens;
  if (n < 2) {
    return out.Unknown("decode.max_new_tokens = " + std::to_string(n) +
                       ": the first token comes from the eager prefill, so at least 2 are needed "
                       "to replay the graph");
  }
  int64_t longest = 0;
  for (const auto& p : ref.prompts) longest = std::max(longest, p.input_ids.size(0));

  // Token equality, prompt by prompt, through one captured graph (batch 1) reused across
  // prompts of different lengths.
  Result<std::unique_ptr<CudaGraphDecoder>> one = CudaGraphDecoder::Create(model, 1, longest + n);
  if (!one.ok()) return out.Fail(FailureClass::kNativeRuntime, one.status().message());
  int64_t matched = 0, total = 0;
  std::string first_mismatch;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    const torch::Tensor& prompt = ref.prompts[i].input_ids;
    const torch::Tensor eager = GreedyDecode(model, prompt, n, ctx.device);
    Result<torch::Tensor> graph = (*one)->Generate(prompt.unsqueeze(0), n);
    if (!graph.ok()) return out.Fail(FailureClass::kNativeRuntime, graph.status().message());
    const torch::Tensor eq = graph->select(0, 0) == eager;
    matched += eq.sum().item<int64_t>();
    total += n;
    if (first_mismatch.empty() && !eq.all().item<bool>()) {
      const int64_t j = (~eq).nonzero()[0][0].item<int64_t>();
      first_mismatch = "prompt " + std::to_string(i) + " (" + std::to_string(prompt.size(0)) +
                       " tokens): token " + std::to_string(j) + " graph " +
                       std::to_string(graph->select(0, 0)[j].item<int64_t>()) + " vs eager " +
                       std::to_string(eager[j].item<int64_t>());
    }
  }
  out.Count("tokens_matched", matched);
  out.Count("tokens_total", total);
  out.Count("prompts", static_cast<int64_t>(ref.prompts.size()));

  // Step logits through the graph along upstream's tokens, against upstream's decode logits.
  LogitComparison vs_decode;
  for (const ReferencePrompt& p : ref.prompts) {
    const ReferenceRun& run = p.For(ctx.spec.precision);
    Result<torch::Tensor> steps =
        (*one)->ForcedLogits(p.input_ids.unsqueeze(0), run.greedy_ids.slice(0, 0, n).unsqueeze(0));
    if (!steps.ok()) return out.Fail(FailureClass::kNativeRuntime, steps.status().message());
    vs_decode.Add(run.decode_logits.slice(0, 0, n), steps->select(0, 0));
  }
  const ComparisonSite site{ctx.spec.precision, ref.device, "cuda", ref.cpu_capability,
                            CpuCapability()};
  const DecodeFloor& floor = ref.DecodeFloorFor(ctx.spec.precision);
  const Envelope* envelope = ref.envelope.For(ctx.spec.precision);
  const LogitBars bars =
      envelope ? EnvelopeDecodeStepBars(site, envelope->decode_steps, floor.max_abs_diff,
                                        floor.kl_mean)
               : DecodeStepBars(LogitBarsFor(site, LogitKind::kDecodeSteps), floor.max_abs_diff,
                                floor.kl_mean);
  out.Text("site", site.Describe());
  internal::EnvelopeFigure(out, envelope);
  out.Real("steps_max_abs_diff", vs_decode.max_abs_diff(), "logits");
  out.Real("steps_kl_mean", vs_decode.kl_mean(), "nats");
  out.Real("steps_top1_agreement", vs_decode.top1_agreement_percent(), "percent");
  const double tie_gap = NearTieGap(bars);
  out.Count("steps_top1_near_tie_flips", vs_decode.near_tie_flips(tie_gap));
  out.Real("steps_bar_max_abs_diff", bars.max_abs_diff, "logits");
  out.Real("steps_bar_kl_mean", bars.kl_mean, "nats");
  out.Real("steps_bar_top1_agreement", bars.top1_percent, "percent");
  out.Text("bars", bars.basis);
  std::vector<std::string> steps_missed;
  if (!(vs_decode.max_abs_diff() <= bars.max_abs_diff)) {
    steps_missed.push_back("max_abs_diff " + Num(vs_decode.max_abs_diff()) + " > " + Num(bars.max_abs_diff));
  }
  if (!(vs_decode.kl_mean() <= bars.kl_mean)) {
    steps_missed.push_back("kl_mean " + Num(vs_decode.kl_mean()) + " > " + Num(bars.kl_mean));
  }
  if (!(vs_decode.top1_agreement_percent(tie_gap) >= bars.top1_percent)) {
    steps_missed.push_back("top1_agreement apart from near-ties " +
                           Num(vs_decode.top1_agreement_percent(tie_gap)) + "% < " +
                           Num(bars.top1_percent) + "%");
  }

  // Speed per batch size: eager steps vs replays, the first prompt in every row.
  const torch::Tensor first = ref.prompts.front().input_ids;
  for (int64_t b : kSpeedBatchSizes) {
    const torch::Tensor rows = first.unsqueeze(0).expand({b, first.size(0)}).contiguous();
    const double eager_ms = EagerBatchMsPerToken(model, rows, n, ctx.device);
    Result<std::unique_ptr<CudaGraphDecoder>> dec =
        CudaGraphDecoder::Create(model, b, first.size(0) + n);
    if (!dec.ok()) return out.Fail(FailureClass::kNativeRuntime, dec.status().message());
    double graph_ms = 0;
    Result<torch::Tensor> ids = (*dec)->Generate(rows, n, &graph_ms);
    if (!ids.ok()) return out.Fail(FailureClass::kNativeRuntime, ids.status().message());
    const std::string k = "_b" + std::to_string(b);
    out.Real("eager_ms_per_token" + k, eager_ms, "ms");
    out.Real("graph_ms_per_token" + k, graph_ms, "ms");
    out.Real("speedup" + k, graph_ms > 0 ? eager_ms / graph_ms : 0.0, "ratio");
  }
  if (!steps_missed.empty()) {
    return out.Fail(FailureClass::kAdapterContract,
                    "graph decode-step logits vs upstream's decode logits: " +
                        internal::JoinFew(steps_missed) + " (" + site.Describe() + "; " +
                        bars.basis + ")");
  }
  if (matched != total) {
    return out.Fail(FailureClass::kNativeRuntime,
                    "graph decode differs from eager decode: " + std::to_string(matched) + "/" +
                        std::to_string(total) + " tokens equal; first: " + first_mismatch);
  }
  return out;
}

}  // namespace gatehouse::worker
