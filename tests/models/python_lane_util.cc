#include "tests/models/python_lane_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tests/common/temp_dir.h"
#include "tests/models/family_test_util.h"
#include "tests/worker/gloo_ranks.h"

namespace gatehouse::worker::lane_test {

std::map<std::string, std::string> Fixtures(const std::set<std::string>& families) {
  std::map<std::string, std::string> out;
  if (!fs::is_directory(test_util::TestdataDir())) return out;
  for (const auto& entry : fs::directory_iterator(test_util::TestdataDir())) {
    std::ifstream in(entry.path() / ".done");
    if (!in) continue;
    const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    const std::string family = j["variant"].value("family", "");
    if (families.count(family)) out[entry.path().filename().string()] = family;
  }
  return out;
}

std::vector<WorkerRun> RunWorker(const std::string& entry, const std::string& family,
                                 const std::string& variant, const std::string& precision,
                                 const std::vector<std::string>& phases, int world,
                                 const std::string& sys_path,
                                 const std::string& dimension,
                                 const std::string& worker_flags) {
  test_util::TempDir attempt;
  json j = test_util::FixtureRunSpecJson(test_util::FixtureDir(variant), family, precision,
                                         attempt.path());
  if (dimension.find('=') == std::string::npos) {
    j["topology"][dimension] = world;
  } else {
    // "dp=2,tp=2": several dimensions.
    std::stringstream parts(dimension);
    for (std::string part; std::getline(parts, part, ',');) {
      const size_t eq = part.find('=');
      j["topology"][part.substr(0, eq)] = std::stoi(part.substr(eq + 1));
    }
  }
  j["phases"] = phases;
  std::ofstream(attempt.path() / "run.json") << j.dump();
  const std::string python_path =
      (sys_path.empty() ? "" : " --python-path " + sys_path) + " --python-path " + GATEHOUSE_ADAPTERS_DIR;
  const std::string worker = "timeout 600 " + std::string(GATEHOUSE_WORKER) + " --run-spec " +
                             (attempt.path() / "run.json").string() + " --python-entry " + entry +
                             python_path + (worker_flags.empty() ? "" : " " + worker_flags);
  std::string cmd;
  const std::string dir = attempt.path().string();
  if (world == 1) {
    // (A rendezvous at world size 1 too: --parallel-measure-only joins a group of one.)
    cmd = "export MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(test_util::FreePort()) + "; " +
          worker + " > " + dir + "/events0.jsonl 2> " + dir + "/log0.txt; echo $? > " + dir + "/rc0";
  } else {
    cmd = "export WORLD_SIZE=" + std::to_string(world) +
          " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(test_util::FreePort()) +
          " GATEHOUSE_GROUP_TIMEOUT_S=120; for r in $(seq " + std::to_string(world - 1) +
          " -1 0); do (RANK=$r LOCAL_RANK=$r " + worker + " > " + dir + "/events$r.jsonl 2> " +
          dir + "/log$r.txt; echo $? > " + dir + "/rc$r) & done; wait";
  }
  EXPECT_NE(std::system(("sh -c '" + cmd + "'").c_str()), -1) << cmd;
  std::vector<WorkerRun> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::ifstream events(attempt.path() / ("events" + std::to_string(r) + ".jsonl"));
    std::string line;
    while (std::getline(events, line)) {
      const json ev = json::parse(line, nullptr, false);
      if (ev.is_discarded()) continue;
      const std::string kind = ev.value("event", "");
      if (kind == "phase_end") out[r].ends[ev.value("phase", "")] = ev;
      if (kind == "figure") out[r].figures[ev.value("phase", "")][ev.value("name", "")] = ev["value"];
      if (kind == "run_end") out[r].run_end = ev.value("status", "");
    }
    std::ifstream(attempt.path() / ("rc" + std::to_string(r))) >> out[r].exit_code;
    if (out[r].run_end.empty()) {
      std::ifstream log(attempt.path() / ("log" + std::to_string(r) + ".txt"));
      ADD_FAILURE() << "rank " << r << " ended without run_end; its log:\n" << log.rdbuf();
    }
  }
  return out;
}
void WriteSpecPackage(const fs::path& dir, const std::string& name, const std::string& family,
                      const std::string& body) {
  fs::create_directories(dir / name);
  std::ofstream(dir / name / "__init__.py") << "";
  std::ofstream(dir / name / "spec.py")
      << "import dataclasses\nfrom gh_archon." << family << ".spec import SPEC as _GOOD\n" << body;
}

}  // namespace gatehouse::worker::lane_test
