#include "cli/body_flags.h"

#include <sstream>
#include <utility>

namespace gatehouse::cli {

void AddBodyFlags(CLI::App& command, BodyFlags& f) {
  command.add_option("--family", f.family, "model family the adapter registers");
  command.add_option("--checkpoint", f.checkpoint, "absolute path of the HF checkpoint directory");
  command.add_option("--reference", f.reference, "absolute path of the reference bundle");
  command.add_option("--precision", f.precision, "fp32 or bf16");
  command.add_option("--mode", f.mode, "eager or cuda_graph");
  command.add_option("--device", f.device, "cpu or cuda");
  command.add_option("--tp", f.tp, "tensor-parallel size")->check(CLI::Range(1, 64));
  command.add_option("--phases", f.phases, "comma-separated phases (default: the controller's)");
  command.add_option("--max-new-tokens", f.max_new_tokens, "greedy decode length")
      ->check(CLI::Range(1, 4096));
  command.add_option("--training-steps", f.steps, "optimizer steps")->check(CLI::Range(2, 1000));
}

void ApplyBodyFlags(const BodyFlags& f, nlohmann::json& body) {
  for (const auto& [key, value] :
       {std::pair{"model_family", &f.family}, std::pair{"checkpoint", &f.checkpoint},
        std::pair{"reference", &f.reference}, std::pair{"precision", &f.precision},
        std::pair{"mode", &f.mode}, std::pair{"device", &f.device}}) {
    if (!value->empty()) body[key] = *value;
  }
  if (f.tp > 0) body["topology"]["tp"] = f.tp;
  if (f.max_new_tokens > 0) body["decode"]["max_new_tokens"] = f.max_new_tokens;
  if (f.steps > 0) body["training"]["steps"] = f.steps;
  if (!f.phases.empty()) {
    body["phases"] = nlohmann::json::array();
    std::stringstream list(f.phases);
    for (std::string p; std::getline(list, p, ',');) {
      if (!p.empty()) body["phases"].push_back(p);
    }
  }
}

}  // namespace gatehouse::cli
