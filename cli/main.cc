// gatehouse: the command line CI systems and engineers use against a controller's REST API
// (docs/cli.md; the API is docs/protocols.md §1).
//
//   gatehouse submit --repository R --branch B --family F --checkpoint DIR [...] [--wait]
//   gatehouse submit --body cell.json [--wait] [--junit out.xml]
//   gatehouse submit --matrix gatehouse-matrix.json [--wait] [--junit out.xml]
//   gatehouse wait ID... [--junit out.xml]
//   gatehouse report ID
//   gatehouse logs ID [--stream worker] [--attempt N] [--follow]
//   gatehouse cancel ID [--reason TEXT]
//   gatehouse retry ID
//
// The token comes from GATEHOUSE_TOKEN or the file --token-file / GATEHOUSE_TOKEN_FILE names,
// never from the command line (argv is visible to every user of the machine). Exit codes:
// cli/verdict.h.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/api_client.h"
#include "cli/body_flags.h"
#include "cli/matrix.h"
#include "cli/submit.h"
#include "cli/verdict.h"
#include "common/sha256.h"
#include "local/run_command.h"

namespace {

using gatehouse::Result;
using gatehouse::Status;
using gatehouse::cli::ApiClient;
using nlohmann::json;
namespace cli = gatehouse::cli;
namespace local = gatehouse::local;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

/// The bearer token: GATEHOUSE_TOKEN, else the first line of `token_file`; empty when neither.
Result<std::string> ReadToken(const std::string& token_file) {
  if (std::string t = Env("GATEHOUSE_TOKEN"); !t.empty()) return t;
  if (token_file.empty()) return std::string();
  const std::string where = "token file " + token_file + " (--token-file or GATEHOUSE_TOKEN_FILE)";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(token_file, ec)) {
    return Status::InvalidArgument(where + ": not a readable file");
  }
  std::ifstream in(token_file);
  if (!in) return Status::InvalidArgument(where + ": cannot read it");
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) return Status::InvalidArgument(where + ": the first line is empty");
  return token;
}

/// A JSON object from `path`; errors name the flag and say whether the file is missing or what
/// the parser found where.
Result<json> ReadJsonObject(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument(flag + " " + path + ": cannot read it");
  try {
    json j = json::parse(in);
    if (!j.is_object()) return Status::InvalidArgument(flag + " " + path + ": not a JSON object");
    return j;
  } catch (const json::parse_error& e) {
    return Status::InvalidArgument(flag + " " + path + ": not valid JSON: " + e.what());
  }
}

/// A full cell id (64 lowercase hex); the 12-hex form in progress lines is for reading only.
Status CheckCellId(const std::string& id) {
  if (id.size() == 64 && id.find_first_not_of("0123456789abcdef") == std::string::npos) {
    return Status::Ok();
  }
  return Status::InvalidArgument("cell id '" + id +
                                 "': expected the full 64-hex id (submit and wait print it)");
}

/// "branch main, checkpoint /data/x" for a submit body, naming the cell a refusal is about.
std::string DescribeBody(const json& body) {
  std::string out;
  for (const char* key : {"repository", "branch", "commit", "checkpoint", "precision"}) {
    if (body.contains(key) && body[key].is_string()) {
      out += (out.empty() ? "" : ", ") + std::string(key) + " " + body[key].get<std::string>();
    }
  }
  return out;
}

/// The error text of a non-2xx response: its {"error": ...} or the raw body.
std::string ErrorText(const cli::ApiResponse& r) {
  json j = json::parse(r.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_string()) return j["error"];
  return r.body;
}

/// Exit code for a failed call: the controller unreachable or 5xx -> kExitUnreachable; 4xx ->
/// kExitUsage. Prints the reason.
int CallFailed(const Result<cli::ApiResponse>& r, const std::string& what) {
  if (!r.ok()) {
    std::cerr << "gatehouse: " << what << ": " << r.status().message() << "\n";
    return cli::kExitUnreachable;
  }
  std::cerr << "gatehouse: " << what << ": HTTP " << r->status << ": " << ErrorText(*r) << "\n";
  return r->status >= 500 ? cli::kExitUnreachable : cli::kExitUsage;
}

bool Ok(const Result<cli::ApiResponse>& r) { return r.ok() && r->status >= 200 && r->status < 300; }

/// The "status" of a cell object; "" when `cell` is no cell object.
std::string CellStatus(const json& cell) {
  return cell.is_object() && cell.contains("status") && cell["status"].is_string()
             ? cell["status"].get<std::string>()
             : std::string();
}

struct WaitOptions {
  int timeout_s = 3600;
  int poll_ms = 2000;
  std::string junit;
  /// When the command gives up: started + timeout_s (resolving a submit counts too).
  std::chrono::steady_clock::time_point deadline;
};

/// POSTs a submit body, again while the controller is still digesting its checkpoint or
/// reference (202 "resolving", each new reason printed to stderr), until o.deadline.
Result<cli::ApiResponse> PostCell(const ApiClient& api, const json& body, const WaitOptions& o) {
  cli::PostCellOptions post;
  post.post = [&api, text = body.dump()] { return api.Call("POST", "/api/v1/cells", text); };
  post.deadline = o.deadline;
  return cli::PostCell(post, std::cerr);
}

/// The exit code of a submit or reference whose digests were not known by the deadline.
int ResolvingTimedOut(const Status& s, const std::string& what, int timeout_s) {
  std::cerr << "gatehouse: " << what << ": " << s.message() << " after " << timeout_s
            << " s (--timeout-s)\n";
  return cli::kExitTimeout;
}

/// Polls every cell until it ends or the deadline passes, printing each phase as it ends;
/// writes JUnit XML when asked (also when the wait ends early: what was seen, the rest as
/// unfinished); returns the exit code.
int WaitForCells(const ApiClient& api, const std::vector<std::string>& ids, const WaitOptions& o) {
  const auto deadline = o.deadline;
  std::map<std::string, json> last;
  std::map<std::string, std::set<std::string>> seen;
  std::map<std::string, std::string> waiting_said;
  std::set<std::string> open(ids.begin(), ids.end());
  int transient_failures = 0;
  bool reached = false;  // retries only once the controller answered: a restart, not a typo
  int code = -1;         // set when the wait ends on an error
  while (!open.empty() && code < 0) {
    for (auto it = open.begin(); it != open.end();) {
      auto r = api.Call("GET", "/api/v1/cells/" + *it);
      if (!Ok(r)) {
        // A controller restart must not fail CI: retry for a while before giving up.
        if (reached && (!r.ok() || r->status >= 500) && ++transient_failures < 30) {
          if (transient_failures == 1) {
            std::cerr << "gatehouse: " << (r.ok() ? "HTTP " + std::to_string(r->status)
                                                  : r.status().message())
                      << "; retrying (30 polls)\n";
          }
          ++it;
          continue;
        }
        code = CallFailed(r, "cell " + *it);
        break;
      }
      transient_failures = 0;
      reached = true;
      json cell = json::parse(r->body, nullptr, false);
      if (!cell.is_object()) {
        std::cerr << "gatehouse: cell " << *it << ": the controller answered no JSON object\n";
        code = cli::kExitUnreachable;
        break;
      }
      // Why a queued cell is not placed (no agent with a GPU, all slots busy, ...), once per
      // change: a wait that prints nothing for hours helps nobody.
      if (auto w = cell.find("waiting_reason"); w != cell.end() && w->is_string() &&
                                                 *w != waiting_said[*it]) {
        waiting_said[*it] = w->get<std::string>();
        std::cout << it->substr(0, 12) << " waiting: " << waiting_said[*it] << "\n";
      }
      for (const std::string& line : cli::NewPhaseLines(cell, seen[*it])) std::cout << line << "\n";
      std::cout.flush();
      last[*it] = cell;
      if (cli::IsFinalStatus(CellStatus(cell))) {
        for (const std::string& line : cli::EndLines(cell)) std::cout << line << "\n";
        it = open.erase(it);
      } else {
        ++it;
      }
    }
    if (open.empty() || code >= 0) break;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(o.poll_ms));
  }
  std::vector<json> cells;
  for (const std::string& id : ids) {
    cells.push_back(last.count(id) ? last[id] : json{{"id", id}, {"status", "unknown"}});
  }
  if (!o.junit.empty()) {
    std::ofstream out(o.junit);
    out << cli::JUnitXml(cells);
    if (!out) std::cerr << "gatehouse: cannot write --junit " << o.junit << "\n";
  }
  if (code >= 0) return code;
  if (!open.empty()) {
    std::cerr << "gatehouse: " << open.size() << " cell(s) still running after " << o.timeout_s
              << " s\n";
    return cli::kExitTimeout;
  }
  return cli::VerdictExitCode(cells);
}

/// Writes the reference bundle of passed reference cell `id` into `dir` (created), each file
/// fetched by digest and checked against it. Returns an exit code.
int DownloadBundle(const ApiClient& api, const std::string& id, const std::string& dir) {
  auto r = api.Call("GET", "/api/v1/cells/" + id);
  if (!Ok(r)) return CallFailed(r, "cell " + id);
  json cell = json::parse(r->body, nullptr, false);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::cerr << "gatehouse: --out " << dir << ": " << ec.message() << "\n";
    return cli::kExitUsage;
  }
  int files = 0;
  // The passed attempt is the latest; an earlier (failed) attempt's files are not the bundle.
  const json attempts = cell.is_object() ? cell.value("attempts", json::array()) : json::array();
  const json latest = attempts.empty() ? json::object() : attempts.back();
  for (const json& a : cell.is_object() ? cell.value("artifacts", json::array()) : json::array()) {
    if (!latest.contains("id") || a.value("attempt_id", int64_t{-1}) != latest["id"]) continue;
    const std::string name = a.value("name", ""), digest = a.value("digest", "");
    constexpr std::string_view kPrefix = "reference/";
    if (name.rfind(kPrefix, 0) != 0 || name.find('/', kPrefix.size()) != std::string::npos) continue;
    // Streamed to a .partial file and hashed on the way; the file takes its name only when
    // its digest is the one stored (a bundle holds 0.65 GB of logits at a 151936 vocabulary).
    const auto path = std::filesystem::path(dir) / name.substr(kPrefix.size());
    auto partial = path;
    partial += ".partial";
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) {
      std::cerr << "gatehouse: cannot write " << partial.string() << "\n";
      return cli::kExitUsage;
    }
    gatehouse::Sha256 sha;
    auto blob = api.Fetch("/api/v1/artifacts/" + digest, [&](std::string_view piece) {
      sha.Update(piece);
      out.write(piece.data(), static_cast<std::streamsize>(piece.size()));
      return out ? gatehouse::Status::Ok()
                 : gatehouse::Status::Internal("cannot write " + partial.string());
    });
    out.close();
    const auto drop = [&] { std::filesystem::remove(partial, ec); };
    if (!blob.ok() && blob.status().code() == gatehouse::StatusCode::kInternal) {
      drop();
      std::cerr << "gatehouse: artifact " << name << ": " << blob.status().message() << "\n";
      return cli::kExitUsage;
    }
    if (!Ok(blob)) {
      drop();
      return CallFailed(blob, "artifact " + name);
    }
    if (!out || "sha256:" + sha.FinalHex() != digest) {
      drop();
      std::cerr << "gatehouse: artifact " << name << ": the bytes received do not have digest "
                << digest << "\n";
      return cli::kExitUnreachable;
    }
    std::filesystem::rename(partial, path, ec);
    if (ec) {
      drop();
      std::cerr << "gatehouse: cannot write " << path.string() << ": " << ec.message() << "\n";
      return cli::kExitUsage;
    }
    std::cout << path.string() << " " << digest << "\n";
    ++files;
  }
  if (files == 0) {
    std::cerr << "gatehouse: cell " << id << " stored no reference bundle\n";
    return cli::kExitBlocked;
  }
  return cli::kExitPass;
}

/// Creates (truncates) the --junit file now, so that an unwritable path is found before any
/// cell is submitted or waited for, not after the verdict.
Status CheckJUnitPath(const std::string& path) {
  if (path.empty()) return Status::Ok();
  std::ofstream out(path, std::ios::trunc);
  if (!out) return Status::InvalidArgument("--junit " + path + ": cannot write it");
  return Status::Ok();
}

/// Submits every body (a refusal does not stop the others: they are evidence), printing
/// "<id> created|existing <status>" per cell; then, with `wait`, waits for their verdicts.
/// Returns the exit code.
int SubmitBodies(const ApiClient& api, const std::vector<json>& bodies, bool wait,
                 const WaitOptions& wait_options) {
  std::vector<std::string> ids;
  int refused = cli::kExitPass;
  if (Status s = CheckJUnitPath(wait_options.junit); !s.ok()) {
    std::cerr << "gatehouse: " << s.message() << "\n";
    return cli::kExitUsage;
  }
  for (const json& body : bodies) {
    auto r = PostCell(api, body, wait_options);
    if (!r.ok() && r.status().code() == gatehouse::StatusCode::kDeadlineExceeded) {
      return ResolvingTimedOut(r.status(), "submit (" + DescribeBody(body) + ")",
                               wait_options.timeout_s);
    }
    if (!Ok(r)) {
      const int code = CallFailed(r, "submit (" + DescribeBody(body) + ")");
      if (code == cli::kExitUnreachable) return code;
      refused = code;
      continue;
    }
    json cell = json::parse(r->body, nullptr, false);
    if (!cell.is_object() || !cell.contains("id") || !cell["id"].is_string()) {
      std::cerr << "gatehouse: submit: the controller answered no cell: " << r->body << "\n";
      return cli::kExitUnreachable;
    }
    const std::string id = cell["id"];
    // Two matrix entries may name the same inputs: one cell, waited for once.
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    std::cout << id << " " << (cell.value("created", false) ? "created" : "existing")
              << " " << CellStatus(cell) << "\n";
    std::cout.flush();
  }
  if (refused != cli::kExitPass || !wait) return refused;
  return WaitForCells(api, ids, wait_options);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gatehouse: run validation cells here, submit them and wait for their verdicts"};
  app.set_version_flag("--version", std::string("gatehouse ") + GATEHOUSE_VERSION);
  app.require_subcommand(1);
  app.fallthrough();  // the global options may follow the subcommand too
  std::string controller = Env("GATEHOUSE_URL").empty() ? "http://127.0.0.1:8080"
                                                         : Env("GATEHOUSE_URL");
  std::string token_file = Env("GATEHOUSE_TOKEN_FILE");
  std::string ca_file;
  app.add_option("--controller", controller, "controller URL (env GATEHOUSE_URL)")
      ->capture_default_str();
  app.add_option("--token-file", token_file,
                 "file holding the API token (env GATEHOUSE_TOKEN_FILE; GATEHOUSE_TOKEN wins)");
  app.add_option("--ca-file", ca_file, "PEM CA of the controller's certificate (https)");

  // submit
  auto* submit = app.add_subcommand("submit", "submit cells; print their ids");
  std::string body_file, matrix_file, repository, branch, commit;
  cli::BodyFlags body_flags;
  bool wait = false;
  WaitOptions wait_options;
  auto* body_option = submit->add_option(
      "--body", body_file, "a JSON submit body (docs/protocols.md §1); flags override");
  submit->add_option("--matrix", matrix_file,
                     "a matrix file: one cell per combination of its axes (docs/cli.md); "
                     "flags override every cell")
      ->excludes(body_option);
  submit->add_option("--repository", repository, "git URL or absolute path of the adapter");
  submit->add_option("--branch", branch, "branch to resolve");
  submit->add_option("--commit", commit, "40-hex commit");
  cli::AddBodyFlags(*submit, body_flags);
  submit->add_flag("--wait", wait, "wait for the verdict; the exit code says it");
  // reference
  auto* reference_cmd = app.add_subcommand(
      "reference", "submit a reference cell: upstream (transformers) on a checkpoint makes the "
                   "bundle validation cells compare with; print its id");
  std::string ref_checkpoint, ref_prompts, ref_device, ref_out;
  int ref_max_new_tokens = 0, ref_steps = 0;
  bool ref_wait = false;
  reference_cmd->add_option("--checkpoint", ref_checkpoint,
                            "absolute path of the HF checkpoint directory")
      ->required();
  reference_cmd->add_option("--prompts", ref_prompts,
                            "JSON file: a list of {\"ids\": [...]} or {\"text\": \"...\", "
                            "\"chat\": true}; default: chosen from config.json");
  reference_cmd->add_option("--device", ref_device, "cpu or cuda");
  reference_cmd->add_option("--max-new-tokens", ref_max_new_tokens, "greedy decode length")
      ->check(CLI::Range(1, 4096));
  reference_cmd->add_option("--training-steps", ref_steps, "optimizer steps of the trace")
      ->check(CLI::Range(2, 1000));
  reference_cmd->add_flag("--wait", ref_wait, "wait for the verdict; the exit code says it");
  reference_cmd->add_option("--out", ref_out,
                            "with --wait: after a PASS, download the bundle into this directory");
  // hide / show: a cell out of readiness and the matrix, and back (admin; evidence is kept).
  std::string visibility_id, visibility_reason;
  CLI::App* visibility = nullptr;
  for (const char* action : {"hide", "show"}) {
    auto* sub = app.add_subcommand(action, std::string(action) +
                                               " a cell in readiness and the matrix (admin token; "
                                               "the cell and its evidence stay)");
    sub->add_option("id", visibility_id, "cell id")->required();
    sub->add_option("--reason", visibility_reason, "why (stored with the action)")->required();
  }
  // branches: the designated branches readiness counts (GET; with --set, PUT as admin).
  auto* branches_cmd = app.add_subcommand(
      "branches", "print which branches of a repository readiness and the matrix count; "
                  "--set changes them (admin token)");
  std::string branches_repository, branches_reason;
  std::vector<std::string> branches_set;
  bool branches_reset = false;
  branches_cmd->add_option("--repository", branches_repository, "the repository as cells name it")
      ->required();
  auto* set_option = branches_cmd->add_option("--set", branches_set, "designate these branches");
  branches_cmd->add_flag("--reset", branches_reset, "back to the repository's default branch")
      ->excludes(set_option);
  branches_cmd->add_option("--reason", branches_reason, "why (stored with the setting)");

  // run (local/run_command.h)
  local::RunCommand run_command;
  local::AddRunCommand(app, run_command);
  for (auto* sub : {submit, reference_cmd, run_command.command,
                    app.add_subcommand("wait", "wait for cells' verdicts")}) {
    sub->add_option("--timeout-s", wait_options.timeout_s, "give up after this many seconds")
        ->capture_default_str()
        ->check(CLI::Range(1, 7 * 24 * 3600));
    sub->add_option("--poll-ms", wait_options.poll_ms, "poll interval")
        ->capture_default_str()
        ->check(CLI::Range(100, 60000));
    sub->add_option("--junit", wait_options.junit, "write JUnit XML here");
  }
  CLI::App* wait_cmd = app.get_subcommand("wait");
  std::vector<std::string> wait_ids;
  wait_cmd->add_option("id", wait_ids, "cell ids")->required();

  auto* report = app.add_subcommand("report", "print a cell's Markdown evidence report");
  std::string report_id;
  report->add_option("id", report_id, "cell id")->required();

  auto* logs = app.add_subcommand("logs", "print a cell's log stream");
  std::string logs_id, stream = "worker";
  int attempt = 0;
  bool follow = false;
  logs->add_option("id", logs_id, "cell id")->required();
  logs->add_option("--stream", stream, "worker, build, worker-stdout, ...")->capture_default_str();
  logs->add_option("--attempt", attempt, "attempt number (default: the latest)");
  logs->add_flag("--follow", follow, "keep printing until the cell ends");

  auto* cancel = app.add_subcommand("cancel", "cancel a cell's latest attempt");
  std::string cancel_id, cancel_reason;
  cancel->add_option("id", cancel_id, "cell id")->required();
  cancel->add_option("--reason", cancel_reason, "why (stored and shown)");

  auto* retry = app.add_subcommand(
      "retry", "run a cell again after an end without a verdict (error, lost, cancelled, "
               "timed_out, blocked); then `gatehouse wait ID`");
  std::string retry_id;
  retry->add_option("id", retry_id, "cell id")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return e.get_exit_code() == 0 ? rc : cli::kExitUsage;
  }

  // A local run needs no controller; with --submit, its PASS is submitted below.
  json local_body;
  if (*run_command.command) {
    const int code = local::ExecuteRun(run_command, local_body);
    if (!run_command.submit || code != cli::kExitPass) return code;
  }

  Result<cli::ControllerUrl> url = cli::ParseControllerUrl(controller);
  if (!url.ok()) {
    std::cerr << "gatehouse: " << url.status().message() << "\n";
    return cli::kExitUsage;
  }
  Result<std::string> token = ReadToken(token_file);
  if (!token.ok()) {
    std::cerr << "gatehouse: " << token.status().message() << "\n";
    return cli::kExitUsage;
  }
  const ApiClient api(*url, *token, ca_file);
  wait_options.deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(wait_options.timeout_s);

  if (!local_body.is_null()) return SubmitBodies(api, {local_body}, /*wait=*/true, wait_options);
  if (*submit) {
    std::vector<json> bodies = {json::object()};
    for (const auto& [flag, path] : {std::pair{"--body", &body_file}, std::pair{"--matrix", &matrix_file}}) {
      if (path->empty()) continue;
      Result<json> file = ReadJsonObject(flag, *path);
      if (!file.ok()) {
        std::cerr << "gatehouse: " << file.status().message() << "\n";
        return cli::kExitUsage;
      }
      if (flag == std::string("--body")) {
        bodies = {*file};
        continue;
      }
      Result<std::vector<json>> expanded = cli::ExpandMatrix(*file);
      if (!expanded.ok()) {
        std::cerr << "gatehouse: --matrix " << *path << ": " << expanded.status().message() << "\n";
        return cli::kExitUsage;
      }
      bodies = std::move(expanded).value();
    }
    for (json& body : bodies) {
      for (const auto& [key, value] :
           {std::pair{"repository", &repository}, std::pair{"branch", &branch},
            std::pair{"commit", &commit}}) {
        if (!value->empty()) body[key] = *value;
      }
      cli::ApplyBodyFlags(body_flags, body);
    }
    return SubmitBodies(api, bodies, wait, wait_options);
  }
  if (*reference_cmd) {
    json body = {{"kind", "reference"}, {"checkpoint", ref_checkpoint}};
    if (!ref_device.empty()) body["device"] = ref_device;
    if (ref_max_new_tokens > 0) body["decode"]["max_new_tokens"] = ref_max_new_tokens;
    if (ref_steps > 0) body["training"]["steps"] = ref_steps;
    if (!ref_prompts.empty()) {
      std::ifstream in(ref_prompts);
      if (!in) {
        std::cerr << "gatehouse: --prompts " << ref_prompts << ": cannot open\n";
        return cli::kExitUsage;
      }
      json prompts = json::parse(in, nullptr, false);
      if (!prompts.is_array()) {
        std::cerr << "gatehouse: --prompts " << ref_prompts << ": not a JSON list of prompts\n";
        return cli::kExitUsage;
      }
      body["prompts"] = std::move(prompts);
    }
    if (!ref_out.empty() && !ref_wait) {
      std::cerr << "gatehouse: --out needs --wait\n";
      return cli::kExitUsage;
    }
    if (Status s = CheckJUnitPath(wait_options.junit); !s.ok()) {
      std::cerr << "gatehouse: " << s.message() << "\n";
      return cli::kExitUsage;
    }
    auto r = PostCell(api, body, wait_options);
    if (!r.ok() && r.status().code() == gatehouse::StatusCode::kDeadlineExceeded) {
      return ResolvingTimedOut(r.status(), "reference (" + ref_checkpoint + ")",
                               wait_options.timeout_s);
    }
    if (!Ok(r)) return CallFailed(r, "reference (" + ref_checkpoint + ")");
    json cell = json::parse(r->body, nullptr, false);
    if (!cell.is_object() || !cell.contains("id") || !cell["id"].is_string()) {
      std::cerr << "gatehouse: reference: the controller answered no cell: " << r->body << "\n";
      return cli::kExitUnreachable;
    }
    const std::string id = cell["id"];
    std::cout << id << " " << (cell.value("created", false) ? "created" : "existing") << " "
              << CellStatus(cell) << "\n";
    std::cout.flush();
    if (!ref_wait) return cli::kExitPass;
    const int code = WaitForCells(api, {id}, wait_options);
    if (code != cli::kExitPass || ref_out.empty()) return code;
    return DownloadBundle(api, id, ref_out);
  }
  for (const std::string* id : {&report_id, &logs_id, &cancel_id, &retry_id}) {
    if (id->empty()) continue;
    if (Status s = CheckCellId(*id); !s.ok()) {
      std::cerr << "gatehouse: " << s.message() << "\n";
      return cli::kExitUsage;
    }
  }
  if (*wait_cmd) {
    for (const std::string& id : wait_ids) {
      if (Status s = CheckCellId(id); !s.ok()) {
        std::cerr << "gatehouse: " << s.message() << "\n";
        return cli::kExitUsage;
      }
    }
    if (Status s = CheckJUnitPath(wait_options.junit); !s.ok()) {
      std::cerr << "gatehouse: " << s.message() << "\n";
      return cli::kExitUsage;
    }
    return WaitForCells(api, wait_ids, wait_options);
  }
  if (*report) {
    auto r = api.Call("GET", "/api/v1/cells/" + report_id + "/report");
    if (!Ok(r)) return CallFailed(r, "report");
    std::cout << r->body;
    return cli::kExitPass;
  }
  if (*cancel) {
    json body = json::object();
    if (!cancel_reason.empty()) body["reason"] = cancel_reason;
    auto r = api.Call("POST", "/api/v1/cells/" + cancel_id + "/cancel", body.dump());
    if (!Ok(r)) return CallFailed(r, "cancel");
    std::cout << cancel_id << " cancel requested\n";
    return cli::kExitPass;
  }
  for (const char* action : {"hide", "show"}) {
    if (!*app.get_subcommand(action)) continue;
    if (Status s = CheckCellId(visibility_id); !s.ok()) {
      std::cerr << "gatehouse: " << s.message() << "\n";
      return cli::kExitUsage;
    }
    auto r = api.Call("POST", "/api/v1/cells/" + visibility_id + "/" + action,
                      json{{"reason", visibility_reason}}.dump());
    if (!Ok(r)) return CallFailed(r, action);
    std::cout << visibility_id << " " << (action == std::string("hide") ? "hidden" : "shown")
              << "\n";
    return cli::kExitPass;
  }
  if (*branches_cmd) {
    const std::string target =
        "/api/v1/designated-branches?repository=" + cli::EncodeQueryValue(branches_repository);
    Result<cli::ApiResponse> r = Status::Internal("not called");
    if (branches_reset || !branches_set.empty()) {
      json body = {{"branches", branches_reset ? std::vector<std::string>{} : branches_set}};
      if (!branches_reason.empty()) body["reason"] = branches_reason;
      r = api.Call("PUT", target, body.dump());
    } else {
      r = api.Call("GET", target);
    }
    if (!Ok(r)) return CallFailed(r, "branches");
    const json answer = json::parse(r->body, nullptr, false);
    const json entry = answer.is_object() && answer.contains("repositories") &&
                               answer["repositories"].is_array() && !answer["repositories"].empty()
                           ? answer["repositories"][0]
                           : answer;
    std::cout << entry.dump(2) << "\n";
    return cli::kExitPass;
  }
  if (*retry) {
    auto r = api.Call("POST", "/api/v1/cells/" + retry_id + "/retry");
    if (!Ok(r)) return CallFailed(r, "retry");
    const json cell = json::parse(r->body, nullptr, false);
    const json attempts = cell.is_object() ? cell.value("attempts", json::array()) : json::array();
    std::cout << retry_id << " retried as attempt "
              << (attempts.empty() ? 0 : attempts.back().value("number", 0)) << " ("
              << CellStatus(cell) << ")\n";
    return cli::kExitPass;
  }
  // logs: the stream printed whole, then (--follow) what was appended, until the cell ends.
  const std::string target = "/api/v1/cells/" + logs_id + "/log?stream=" + cli::EncodeQueryValue(stream) +
                             (attempt > 0 ? "&attempt=" + std::to_string(attempt) : "");
  size_t printed = 0;
  while (true) {
    auto r = api.Call("GET", target);
    if (!Ok(r)) return CallFailed(r, "logs");
    if (r->body.size() > printed) {
      std::cout << r->body.substr(printed);
      std::cout.flush();
      printed = r->body.size();
    }
    if (!follow) return cli::kExitPass;
    auto cell = api.Call("GET", "/api/v1/cells/" + logs_id);
    if (!Ok(cell)) return CallFailed(cell, "cell " + logs_id);
    if (cli::IsFinalStatus(CellStatus(json::parse(cell->body, nullptr, false)))) {
      // One last read: chunks that arrived with the end.
      auto tail = api.Call("GET", target);
      if (!Ok(tail)) return CallFailed(tail, "logs");  // e.g. the ended attempt lacks the stream
      if (tail->body.size() > printed) std::cout << tail->body.substr(printed);
      return cli::kExitPass;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}
