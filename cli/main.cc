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
//
// The token comes from GATEHOUSE_TOKEN or the file --token-file / GATEHOUSE_TOKEN_FILE names,
// never from the command line (argv is visible to every user of the machine). Exit codes:
// cli/verdict.h.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
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
#include "cli/matrix.h"
#include "cli/verdict.h"

namespace {

using gatehouse::Result;
using gatehouse::Status;
using gatehouse::cli::ApiClient;
using nlohmann::json;
namespace cli = gatehouse::cli;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

/// The bearer token: GATEHOUSE_TOKEN, else the first line of `token_file`; empty when neither.
Result<std::string> ReadToken(const std::string& token_file) {
  if (std::string t = Env("GATEHOUSE_TOKEN"); !t.empty()) return t;
  if (token_file.empty()) return std::string();
  std::ifstream in(token_file);
  if (!in) return Status::InvalidArgument("--token-file " + token_file + ": cannot read it");
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) return Status::InvalidArgument("--token-file " + token_file + " is empty");
  return token;
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

/// The "status" of a cell object in `body`; "" when the body is no cell object.
std::string CellStatus(const json& cell) {
  return cell.is_object() && cell.contains("status") && cell["status"].is_string()
             ? cell["status"].get<std::string>()
             : std::string();
}

struct WaitOptions {
  int timeout_s = 3600;
  int poll_ms = 2000;
  std::string junit;
};

/// Polls every cell until it ends or the deadline passes, printing each phase as it ends;
/// writes JUnit XML when asked; returns the exit code.
int WaitForCells(const ApiClient& api, const std::vector<std::string>& ids, const WaitOptions& o) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(o.timeout_s);
  std::map<std::string, json> last;
  std::map<std::string, std::set<std::string>> seen;
  std::set<std::string> open(ids.begin(), ids.end());
  int transient_failures = 0;
  bool reached = false;  // retries only once the controller answered: a restart, not a typo
  while (!open.empty()) {
    for (auto it = open.begin(); it != open.end();) {
      auto r = api.Call("GET", "/api/v1/cells/" + *it);
      if (!Ok(r)) {
        // A controller restart must not fail CI: retry for a while before giving up.
        if (reached && (!r.ok() || r->status >= 500) && ++transient_failures < 30) {
          ++it;
          continue;
        }
        return CallFailed(r, "cell " + *it);
      }
      transient_failures = 0;
      reached = true;
      json cell = json::parse(r->body, nullptr, false);
      if (!cell.is_object()) {
        std::cerr << "gatehouse: cell " << *it << ": the controller answered no JSON object\n";
        return cli::kExitUnreachable;
      }
      for (const std::string& line : cli::NewPhaseLines(cell, seen[*it])) std::cout << line << "\n";
      std::cout.flush();
      last[*it] = cell;
      if (cli::IsFinalStatus(CellStatus(cell))) {
        std::cout << it->substr(0, 12) << " " << CellStatus(cell) << "\n";
        it = open.erase(it);
      } else {
        ++it;
      }
    }
    if (open.empty()) break;
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
    if (!out) {
      std::cerr << "gatehouse: cannot write --junit " << o.junit << "\n";
      return cli::kExitUsage;
    }
  }
  if (!open.empty()) {
    std::cerr << "gatehouse: " << open.size() << " cell(s) still running after " << o.timeout_s
              << " s\n";
    return cli::kExitTimeout;
  }
  return cli::VerdictExitCode(cells);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gatehouse: submit validation cells and wait for their verdicts"};
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
  std::string body_file, matrix_file, repository, branch, commit, family, checkpoint, reference, precision,
      mode, device, phases;
  int tp = 0, max_new_tokens = 0, steps = 0;
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
  submit->add_option("--family", family, "model family the adapter registers");
  submit->add_option("--checkpoint", checkpoint, "absolute path of the HF checkpoint directory");
  submit->add_option("--reference", reference, "absolute path of the reference bundle");
  submit->add_option("--precision", precision, "fp32 or bf16");
  submit->add_option("--mode", mode, "eager or cuda_graph");
  submit->add_option("--device", device, "cpu or cuda");
  submit->add_option("--tp", tp, "tensor-parallel size")->check(CLI::Range(1, 64));
  submit->add_option("--phases", phases, "comma-separated phases (default: the controller's)");
  submit->add_option("--max-new-tokens", max_new_tokens, "greedy decode length")
      ->check(CLI::Range(1, 4096));
  submit->add_option("--training-steps", steps, "optimizer steps")->check(CLI::Range(2, 1000));
  submit->add_flag("--wait", wait, "wait for the verdict; the exit code says it");
  for (auto* sub : {submit, app.add_subcommand("wait", "wait for cells' verdicts")}) {
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return e.get_exit_code() == 0 ? rc : cli::kExitUsage;
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

  if (*submit) {
    std::vector<json> bodies = {json::object()};
    for (const auto& [flag, path] : {std::pair{"--body", &body_file}, std::pair{"--matrix", &matrix_file}}) {
      if (path->empty()) continue;
      std::ifstream in(*path);
      const json file = json::parse(in, nullptr, false);
      if (!in || !file.is_object()) {
        std::cerr << "gatehouse: " << flag << " " << *path << ": not a JSON object\n";
        return cli::kExitUsage;
      }
      if (flag == std::string("--body")) {
        bodies = {file};
        continue;
      }
      Result<std::vector<json>> expanded = cli::ExpandMatrix(file);
      if (!expanded.ok()) {
        std::cerr << "gatehouse: --matrix " << *path << ": " << expanded.status().message() << "\n";
        return cli::kExitUsage;
      }
      bodies = std::move(expanded).value();
    }
    for (json& body : bodies) {
      for (const auto& [key, value] :
           {std::pair{"repository", &repository}, std::pair{"branch", &branch},
            std::pair{"commit", &commit}, std::pair{"model_family", &family},
            std::pair{"checkpoint", &checkpoint}, std::pair{"reference", &reference},
            std::pair{"precision", &precision}, std::pair{"mode", &mode},
            std::pair{"device", &device}}) {
        if (!value->empty()) body[key] = *value;
      }
      if (tp > 0) body["topology"]["tp"] = tp;
      if (max_new_tokens > 0) body["decode"]["max_new_tokens"] = max_new_tokens;
      if (steps > 0) body["training"]["steps"] = steps;
      if (!phases.empty()) {
        body["phases"] = json::array();
        std::stringstream list(phases);
        for (std::string p; std::getline(list, p, ',');) {
          if (!p.empty()) body["phases"].push_back(p);
        }
      }
    }
    // Every cell is submitted even if one is refused (the others are evidence); a refusal
    // then ends the command without waiting.
    std::vector<std::string> ids;
    int refused = cli::kExitPass;
    for (const json& body : bodies) {
      auto r = api.Call("POST", "/api/v1/cells", body.dump());
      if (!Ok(r)) {
        const int code = CallFailed(r, "submit");
        if (code == cli::kExitUnreachable) return code;
        refused = code;
        continue;
      }
      json cell = json::parse(r->body, nullptr, false);
      if (!cell.is_object() || !cell.contains("id") || !cell["id"].is_string()) {
        std::cerr << "gatehouse: submit: the controller answered no cell: " << r->body << "\n";
        return cli::kExitUnreachable;
      }
      ids.push_back(cell["id"]);
      std::cout << ids.back() << " " << (cell.value("created", false) ? "created" : "existing")
                << " " << CellStatus(cell) << "\n";
      std::cout.flush();
    }
    if (refused != cli::kExitPass || !wait) return refused;
    return WaitForCells(api, ids, wait_options);
  }
  if (*wait_cmd) return WaitForCells(api, wait_ids, wait_options);
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
  // logs: the stream printed whole, then (--follow) what was appended, until the cell ends.
  const std::string target = "/api/v1/cells/" + logs_id + "/log?stream=" + stream +
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
      if (Ok(tail) && tail->body.size() > printed) std::cout << tail->body.substr(printed);
      return cli::kExitPass;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}
