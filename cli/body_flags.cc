#include "cli/body_flags.h"

#include <algorithm>
#include <charconv>
#include <iterator>
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
  command
      .add_option("--mesh", f.mesh,
                  "topology as KEY=N,...: tp, dp, pp, dp_shard, cp, ep, etp (e.g. dp_shard=2,tp=2)")
      ->check(CLI::Validator(
          [](std::string& value) {
            Result<nlohmann::json> mesh = ParseMeshFlag(value);
            return mesh.ok() ? std::string() : mesh.status().message();
          },
          "KEY=N,..."));
  command.add_option("--phases", f.phases, "comma-separated phases (default: the controller's)");
  command.add_option("--max-new-tokens", f.max_new_tokens, "greedy decode length")
      ->check(CLI::Range(1, 4096));
  command.add_option("--training-steps", f.steps, "optimizer steps")->check(CLI::Range(2, 1000));
}

Result<nlohmann::json> ParseMeshFlag(std::string_view value) {
  static constexpr std::string_view kKeys[] = {"tp", "dp", "pp", "ep", "dp_shard", "cp", "etp"};
  nlohmann::json out = nlohmann::json::object();
  size_t start = 0;
  while (start <= value.size()) {
    const size_t end = std::min(value.find(',', start), value.size());
    const std::string_view item = value.substr(start, end - start);
    const size_t eq = item.find('=');
    const std::string_view key = item.substr(0, eq);
    const std::string_view digits = eq == std::string_view::npos ? "" : item.substr(eq + 1);
    const bool known = std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys);
    int64_t n = 0;
    const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (!known || digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size() ||
        n < 1) {
      return Status::InvalidArgument(
          "'" + std::string(item) + "' is not KEY=N with KEY one of tp, dp, pp, ep, "
          "dp_shard, cp, etp and N a positive integer");
    }
    out[std::string(key)] = n;
    start = end + 1;
  }
  return out;
}

void ApplyBodyFlags(const BodyFlags& f, nlohmann::json& body) {
  for (const auto& [key, value] :
       {std::pair{"model_family", &f.family}, std::pair{"checkpoint", &f.checkpoint},
        std::pair{"reference", &f.reference}, std::pair{"precision", &f.precision},
        std::pair{"mode", &f.mode}, std::pair{"device", &f.device}}) {
    if (!value->empty()) body[key] = *value;
  }
  if (!f.mesh.empty()) {
    // Checked when parsed (AddBodyFlags' validator).
    if (Result<nlohmann::json> mesh = ParseMeshFlag(f.mesh); mesh.ok()) {
      for (const auto& [key, n] : mesh->items()) body["topology"][key] = n;
    }
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
