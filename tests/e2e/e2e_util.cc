#include "e2e_util.h"

#include <gtest/gtest.h>

#include "process_harness.h"

namespace gatehouse::testing {

namespace fs = std::filesystem;
using json = nlohmann::json;

void Git(const fs::path& repo, const std::vector<std::string>& args) {
  std::vector<std::string> full = {"-c", "user.name=Gatehouse Test", "-c",
                                   "user.email=test@gatehouse.invalid"};
  full.insert(full.end(), args.begin(), args.end());
  CommandResult r = RunCommand("git", full, repo);
  ASSERT_EQ(r.exit_code, 0) << "git " << args.front() << ":\n" << r.output;
}

void MakeAdapterRepository(const fs::path& repo) {
  fs::create_directories(repo);
  fs::copy(GATEHOUSE_MODELS_DIR, repo, fs::copy_options::recursive);
  Git(repo, {"init", "-q", "-b", "main"});
  Git(repo, {"add", "-A"});
  Git(repo, {"commit", "-q", "-m", "Llama adapter"});
  Git(repo, {"checkout", "-q", "-b", "rope-keys-bug"});
  Git(repo, {"apply", GATEHOUSE_ROPE_PATCH});
  Git(repo, {"commit", "-q", "-am", "Llama adapter with RoPE not applied to keys"});
  Git(repo, {"checkout", "-q", "main"});
}

const json* FindPhase(const json& cell, const std::string& name) {
  for (const auto& p : cell.at("phases")) {
    if (p.at("phase") == name) return &p;
  }
  return nullptr;
}

std::optional<double> Figure(const json& phase, const std::string& name) {
  for (const auto& f : phase.at("figures")) {
    if (f.at("name") == name && f.at("value").is_number()) return f.at("value").get<double>();
  }
  return std::nullopt;
}

}  // namespace gatehouse::testing
