#include "e2e_util.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>

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

void MakePythonAdapterRepository(const fs::path& repo) {
  fs::create_directories(repo);
  fs::copy(GATEHOUSE_ADAPTERS_DIR, repo, fs::copy_options::recursive);
  std::vector<fs::path> generated;  // caches and build output of local runs, not sources
  for (const auto& entry : fs::recursive_directory_iterator(repo)) {
    const std::string name = entry.path().filename().string();
    if (name == "__pycache__" || name == "build" || name.ends_with(".egg-info")) {
      generated.push_back(entry.path());
    }
  }
  for (const auto& path : generated) fs::remove_all(path);
  WriteTextFile(repo / "gatehouse.recipe.json",
                R"({"recipe_version": 1, "lane": "python",
 "build": {"system": "pip", "source_dir": "."},
 "entries": ["gh_archon.llama.spec:SPEC"]}
)");
  Git(repo, {"init", "-q", "-b", "main"});
  Git(repo, {"add", "-A"});
  Git(repo, {"commit", "-q", "-m", "Llama adapter in Archon's layout"});
  Git(repo, {"checkout", "-q", "-b", "gate-up-swapped"});
  const fs::path names = repo / "gh_archon" / "common" / "names.py";
  std::stringstream text;
  text << std::ifstream(names).rdbuf();
  std::string source = text.str();
  const std::string gate = "\"layers.{}.feed_forward.w1.weight\"";
  const std::string up = "\"layers.{}.feed_forward.w3.weight\"";
  const size_t g = source.find(gate), u = source.find(up);
  if (g == std::string::npos || u == std::string::npos || u < g) {
    ADD_FAILURE() << names << " no longer maps gate_proj to w1 and then up_proj to w3";
    return;
  }
  source.replace(u, up.size(), gate);
  source.replace(g, gate.size(), up);
  WriteTextFile(names, source);
  Git(repo, {"commit", "-q", "-am", "Llama adapter with gate_proj and up_proj swapped"});
  Git(repo, {"checkout", "-q", "main"});
}

std::optional<ControllerPorts> WaitForControllerPorts(Daemon& controller) {
  auto http = controller.WaitForLine(std::regex("http listening on 127\\.0\\.0\\.1:(\\d+)"),
                                     std::chrono::seconds(30));
  auto grpc = controller.WaitForLine(std::regex("grpc listening on 127\\.0\\.0\\.1:(\\d+)"),
                                     std::chrono::seconds(30));
  if (!http || !grpc) return std::nullopt;
  return ControllerPorts{std::stoi(*http), std::stoi(*grpc)};
}

std::string CreateToken(const std::string& bin_dir, const std::string& db,
                        const std::vector<std::string>& create_args) {
  std::vector<std::string> args = {"--db", db, "tokens", "create"};
  args.insert(args.end(), create_args.begin(), create_args.end());
  CommandResult r = RunCommand(bin_dir + "/gatehouse-controller", args, fs::current_path());
  std::smatch m;
  if (r.exit_code != 0 || !std::regex_search(r.output, m, std::regex("gh(api|agent)_[0-9a-f]{64}"))) {
    ADD_FAILURE() << "tokens create failed (exit " << r.exit_code << "):\n" << r.output;
    return "";
  }
  return m.str(0);
}

void WriteTextFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) ADD_FAILURE() << "cannot write " << path;
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

std::string TextFigure(const json& phase, const std::string& name) {
  for (const auto& f : phase.at("figures")) {
    if (f.at("name") == name && f.at("value").is_string()) return f.at("value").get<std::string>();
  }
  return "";
}

}  // namespace gatehouse::testing
