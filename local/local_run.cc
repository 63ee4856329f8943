#include "local/local_run.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "agent/attempt_runner.h"
#include "controller/cell_identity.h"
#include "controller/digest_cache.h"
#include "controller/report.h"
#include "local/digest_book.h"
#include "local/directory_artifacts.h"
#include "local/evidence_recorder.h"
#include "local/tree_resolver.h"

namespace gatehouse::local {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string NowUtc() {
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::chrono::system_clock::to_time_t(
                                                  std::chrono::system_clock::now())));
}

// The next free attempt number under `attempts` (a directory made exclusively: two local runs
// sharing a work dir never take the same one).
Result<int64_t> ClaimAttempt(const fs::path& attempts) {
  std::error_code ec;
  fs::create_directories(attempts, ec);
  int64_t next = 1;
  for (const auto& entry : fs::directory_iterator(attempts, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos &&
        name.size() < 15) {
      next = std::max<int64_t>(next, std::stoll(name) + 1);
    }
  }
  for (int tries = 0; tries < 1000; ++tries, ++next) {
    if (fs::create_directory(attempts / std::to_string(next), ec)) return next;
    if (ec) break;
  }
  return Status::Internal("cannot make an attempt directory under " + attempts.string() +
                          (ec ? ": " + ec.message() : ""));
}

agent::RunnerConfig RunnerConfigFor(const LocalRunOptions& o) {
  agent::RunnerConfig c;
  c.work_dir = fs::absolute(o.work_dir).lexically_normal();
  c.sdk_dir = o.tools.sdk_dir;
  c.cmake_prefix_path = o.tools.cmake_prefix_path;
  c.worker = o.tools.worker;
  c.python = o.tools.python;
  c.reference_python = o.tools.reference_python;
  c.reference_script = o.tools.reference_script;
  c.agent_name = "local";
  return c;
}

// A reference bundle made by an earlier local run of the same reference cell whose files are
// all still stored: its inputs; empty when there is none to reuse.
std::vector<agent::InputFile> StoredReference(const fs::path& record,
                                              const DirectoryArtifacts& store,
                                              std::vector<controller::PhaseRecord>& phases) {
  std::ifstream in(record);
  const json j = json::parse(in, nullptr, false);
  std::vector<agent::InputFile> inputs;
  if (!j.is_object() || !j.contains("inputs") || !j["inputs"].is_array()) return {};
  std::error_code ec;
  for (const json& f : j["inputs"]) {
    agent::InputFile file{"reference", f.value("name", ""), f.value("digest", ""),
                          f.value("size", int64_t{-1})};
    const fs::path blob = store.BlobPath(file.digest);
    if (file.name.empty() || !fs::is_regular_file(blob, ec) ||
        fs::file_size(blob, ec) != static_cast<uintmax_t>(file.size)) {
      return {};
    }
    inputs.push_back(std::move(file));
  }
  for (const json& p : j.value("phases", json::array())) {
    controller::PhaseRecord phase;
    phase.phase = p.value("phase", "");
    phase.status = p.value("status", "");
    phase.reason = p.value("reason", "");
    phases.push_back(std::move(phase));
  }
  return inputs;
}

// The reference cell's bundle: reused when an earlier local run made it (the cell id covers
// the checkpoint's digest, the prompts, the pins and the knobs), else made now by the
// reference runner, as a reference cell on an agent makes it.
Result<std::vector<agent::InputFile>> ReferenceInputs(const controller::FrozenCell& ref,
                                                      const LocalRunOptions& o,
                                                      std::vector<controller::PhaseRecord>& phases) {
  const fs::path work = fs::absolute(o.work_dir);
  std::ostream& progress = *o.progress;
  DirectoryArtifacts store(work / "artifacts");
  const fs::path record = work / "references" / (ref.id + ".json");
  if (auto inputs = StoredReference(record, store, phases); !inputs.empty()) {
    progress << "gatehouse: reference cell " << ref.id.substr(0, 12) << ": reusing its bundle ("
             << record.string() << ")\n";
    return inputs;
  }
  progress << "gatehouse: reference cell " << ref.id.substr(0, 12)
           << ": running upstream (transformers) on " << ref.spec.checkpoint.path << "\n";
  progress.flush();
  GH_ASSIGN_OR_RETURN(const int64_t id, ClaimAttempt(work / "attempts"));
  const fs::path dir = work / "references" / ref.id;
  EvidenceRecorder recorder(ref.id, dir, progress, o.echo);
  agent::AttemptRunner runner(RunnerConfigFor(o));
  runner.SetArtifactChannel(&store);
  runner.Run({id, ref.id, ref.spec_json, {}, {}, {}}, recorder, agent::CancelToken{o.cancel});
  const agent::AttemptEndReport& end = recorder.end();
  std::vector<agent::InputFile> inputs;
  for (const agent::InputFile& f : store.stored()) {
    if (f.role == "reference") inputs.push_back(f);
  }
  if (end.outcome != agent::kOutcomeFinished || recorder.run_status() != "PASS" ||
      inputs.size() != 2) {
    return Status::FailedPrecondition(
        "the reference cell " + ref.id.substr(0, 12) + " made no bundle (" + end.outcome +
        (recorder.run_status().empty() ? "" : ", run_end " + recorder.run_status()) +
        (end.reason.empty() ? "" : ": " + end.reason) + "); its logs: " + (dir / "logs").string());
  }
  phases = recorder.Phases();
  json entry = {{"made_at", NowUtc()}, {"inputs", json::array()}, {"phases", json::array()}};
  for (const agent::InputFile& f : inputs) {
    entry["inputs"].push_back({{"name", f.name}, {"digest", f.digest}, {"size", f.size}});
  }
  for (const controller::PhaseRecord& p : phases) {
    entry["phases"].push_back({{"phase", p.phase}, {"status", p.status}, {"reason", p.reason}});
  }
  std::ofstream(record, std::ios::trunc) << entry.dump(2) << "\n";
  return inputs;
}

// The report: the controller's (controller/report.h) under a line that says what kind of run
// it is.
std::string LocalReport(const controller::CellDetail& detail, const std::string& local_run) {
  return "> **Local run** (`gatehouse run`): " + local_run +
         ". Not a frozen verdict: `gatehouse run --submit` (or `gatehouse submit`) gives one.\n\n" +
         controller::RenderReport(detail);
}

}  // namespace

std::string DescribeLocalRun(const agent::WorkingTree& tree) {
  if (tree.changed.empty()) return "local, unfrozen; tree clean";
  constexpr size_t kNamed = 8;
  std::string out = "local, unfrozen; tree has " + std::to_string(tree.changed.size()) +
                    " changed file" + (tree.changed.size() == 1 ? "" : "s") + ": ";
  for (size_t i = 0; i < tree.changed.size() && i < kNamed; ++i) {
    out += (i ? ", " : "") + tree.changed[i];
  }
  if (tree.changed.size() > kNamed) {
    out += " and " + std::to_string(tree.changed.size() - kNamed) + " more";
  }
  return out;
}

Result<LocalRunResult> RunLocally(const LocalRunOptions& o) {
  if (o.progress == nullptr) return Status::InvalidArgument("no progress stream");
  std::ostream& progress = *o.progress;
  LocalRunResult result;
  GH_ASSIGN_OR_RETURN(result.tree, agent::InspectWorkingTree(o.tree));
  const agent::WorkingTree& tree = result.tree;
  for (const char* field : {"repository", "branch", "commit"}) {
    if (o.body.contains(field)) {
      return Status::InvalidArgument(std::string("field '") + field +
                                     "': a local run takes it from the working tree");
    }
  }
  json body = o.body;
  body["repository"] = !o.repository.empty()      ? o.repository
                       : !tree.origin_url.empty() ? tree.origin_url
                                                  : tree.checkout.path.string();
  body["commit"] = tree.checkout.head;
  if (!tree.branch.empty()) body["branch"] = tree.branch;
  result.submit_body = body;

  const fs::path work = fs::absolute(o.work_dir).lexically_normal();
  std::error_code ec;
  fs::create_directories(work, ec);
  if (ec) return Status::InvalidArgument("--work-dir " + work.string() + ": " + ec.message());
  TreeResolver resolver(tree.checkout.path, tree.checkout.head, tree.branch);
  DigestBookFile book(work / "file-digests.jsonl");
  controller::DigestCache::Options digest_options;
  digest_options.book = &book;
  controller::DigestCache digests(digest_options);
  controller::CellFreezer freezer(o.context, resolver, digests);
  GH_ASSIGN_OR_RETURN(controller::FrozenCell cell, freezer.FreezeAndWait(body.dump()));
  result.cell_id = cell.id;
  result.spec = cell.spec;

  std::vector<agent::InputFile> inputs;
  std::vector<controller::PhaseRecord> reference_phases;
  if (cell.reference_cell) {
    GH_ASSIGN_OR_RETURN(inputs, ReferenceInputs(*cell.reference_cell, o, reference_phases));
  }

  GH_ASSIGN_OR_RETURN(const int64_t attempt_id, ClaimAttempt(work / "attempts"));
  result.out_dir = o.out_dir.empty()
                       ? work / "runs" / (cell.id.substr(0, 12) + "-" + std::to_string(attempt_id))
                       : fs::absolute(o.out_dir);
  const std::string local_run = DescribeLocalRun(tree);
  progress << "gatehouse: cell " << cell.id << " (" << local_run << ")\n";
  progress.flush();
  const std::string started = NowUtc();
  EvidenceRecorder recorder(cell.id, result.out_dir, progress, o.echo);
  DirectoryArtifacts store(work / "artifacts");
  agent::AttemptRunner runner(RunnerConfigFor(o));
  runner.SetArtifactChannel(&store);
  agent::AttemptAssignment assignment{attempt_id, cell.id, cell.spec_json, inputs,
                                      tree.checkout.path, local_run};
  runner.Run(assignment, recorder, agent::CancelToken{o.cancel});
  const agent::AttemptEndReport& end = recorder.end();
  std::vector<controller::PhaseRecord> phases = recorder.Phases();
  result.ending = controller::EndingOf(end.outcome, end.reason, end.exit_code,
                                       recorder.run_status(), phases);
  if (o.cancel != nullptr && o.cancel->load() &&
      result.ending.state == controller::AttemptState::kError) {
    // The stop was asked for here: no verdict, and not an error of the run.
    result.ending.state = controller::AttemptState::kCancelled;
    result.ending.reason = "stopped by SIGINT or SIGTERM: " + result.ending.reason;
  }

  controller::CellDetail detail;
  detail.cell.id = cell.id;
  detail.cell.spec_json = cell.spec_json;
  detail.cell.repository = cell.repository;
  detail.cell.commit_sha = cell.commit;
  detail.cell.branch = cell.branch;
  detail.cell.model_family = cell.model_family;
  detail.cell.created_at = started;
  detail.cell.submitter = "local";
  detail.status = result.ending.state;
  controller::AttemptRecord attempt;
  attempt.id = attempt_id;
  attempt.cell_id = cell.id;
  attempt.number = 1;
  attempt.state = result.ending.state;
  attempt.agent_id = "local";
  attempt.reason = result.ending.reason;
  attempt.run_status = recorder.run_status();
  attempt.created_at = attempt.started_at = started;
  attempt.ended_at = NowUtc();
  detail.attempts = {attempt};
  detail.phases = phases;
  if (cell.reference_cell) {
    controller::PrerequisiteStatus ref;
    ref.role = "reference cell";
    ref.cell_id = cell.reference_cell->id;
    ref.found = true;
    ref.status = controller::AttemptState::kPassed;
    ref.phases = reference_phases;
    detail.prerequisites.push_back(std::move(ref));
  }
  std::ofstream(result.out_dir / "report.md", std::ios::trunc) << LocalReport(detail, local_run);
  std::ofstream(result.out_dir / "spec.json", std::ios::trunc) << cell.spec_json << "\n";
  std::ofstream(result.out_dir / "submit.json", std::ios::trunc)
      << result.submit_body.dump(2) << "\n";
  return result;
}

}  // namespace gatehouse::local
