#include "cli/verdict.h"

#include <array>
#include <cstdio>

namespace gatehouse::cli {
namespace {

using nlohmann::json;

std::string Str(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string ShortId(const json& cell) { return Str(cell, "id").substr(0, 12); }

/// The phase's duration in seconds (0 when not reported).
double Seconds(const json& phase) {
  auto it = phase.find("duration_ms");
  return it != phase.end() && it->is_number() ? it->get<double>() / 1000.0 : 0.0;
}

/// Seconds with millisecond precision, as the progress lines and JUnit show them.
std::string Fixed3(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", seconds);
  return buf;
}

/// XML attribute / text escaping; control characters other than tab and newline (which XML 1.0
/// cannot carry) become '?'.
std::string Xml(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += (c < 0x20 && c != '\t' && c != '\n') ? '?' : static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace

bool IsFinalStatus(std::string_view status) {
  static constexpr std::array<std::string_view, 7> kFinal = {
      "passed", "failed", "error", "lost", "cancelled", "timed_out", "blocked"};
  for (auto s : kFinal) {
    if (s == status) return true;
  }
  return false;
}

int VerdictExitCode(const std::vector<json>& cells) {
  bool any_fail = false, all_pass = true;
  for (const json& cell : cells) {
    const std::string status = Str(cell, "status");
    any_fail |= status == "failed";
    all_pass &= status == "passed";
  }
  if (any_fail) return kExitFail;
  return all_pass ? kExitPass : kExitBlocked;
}

std::vector<std::string> NewPhaseLines(const json& cell, std::set<std::string>& seen) {
  std::vector<std::string> lines;
  auto phases = cell.find("phases");
  if (phases == cell.end() || !phases->is_array()) return lines;
  for (const json& p : *phases) {
    const std::string name = Str(p, "phase"), status = Str(p, "status");
    if (name.empty() || status.empty() || status == "RUNNING" || seen.count(name)) continue;
    seen.insert(name);
    std::string line = ShortId(cell) + " " + name + " " + status + " " + Fixed3(Seconds(p)) + " s";
    if (const std::string reason = Str(p, "reason"); !reason.empty()) line += ": " + reason;
    lines.push_back(std::move(line));
  }
  return lines;
}

std::vector<std::string> EndLines(const nlohmann::json& cell) {
  const std::string status = Str(cell, "status");
  std::vector<std::string> lines = {Str(cell, "id") + " " + status};
  if (status == "passed" || status == "failed") return lines;
  std::string why;
  if (auto a = cell.find("attempts"); a != cell.end() && a->is_array() && !a->empty()) {
    why = Str(a->back(), "reason");
  }
  size_t start = 0;
  while (start < why.size()) {
    size_t end = why.find('\n', start);
    if (end == std::string::npos) end = why.size();
    lines.push_back("  " + why.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::string JUnitXml(const std::vector<json>& cells) {
  std::string xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"gatehouse\">\n";
  for (const json& cell : cells) {
    const json spec = cell.value("spec", json::object());
    const std::string family = Str(spec, "model_family");
    const std::string branch = cell.contains("labels") ? Str(cell["labels"], "branch") : "";
    std::string cases;
    int tests = 0, failures = 0, errors = 0, skipped = 0;
    double total_s = 0;
    for (const json& p : cell.value("phases", json::array())) {
      const std::string status = Str(p, "status"), reason = Str(p, "reason");
      ++tests;
      total_s += Seconds(p);
      cases += "    <testcase classname=\"gatehouse." + Xml(family) + "\" name=\"" +
               Xml(ShortId(cell) + "." + Str(p, "phase")) + "\" time=\"" + Fixed3(Seconds(p)) + "\"";
      if (status == "PASS") {
        cases += "/>\n";
        continue;
      }
      std::string element = "error";
      if (status == "FAIL") {
        element = "failure";
        ++failures;
      } else if (status == "SKIPPED") {
        element = "skipped";
        ++skipped;
      } else {
        ++errors;
      }
      const std::string message =
          status + (reason.empty() ? "" : ": " + reason) +
          (Str(p, "classification").empty() ? "" : " [" + Str(p, "classification") + "]");
      cases += ">\n      <" + element + " message=\"" + Xml(message) + "\"/>\n    </testcase>\n";
    }
    const std::string status = Str(cell, "status");
    const bool unexplained = status != "passed" && status != "failed" && failures + errors == 0;
    if (tests == 0 || unexplained || !IsFinalStatus(status)) {
      // A cell that ended without a phase saying why (a failed build, cancelled while queued,
      // lost, still running at the deadline) still shows up, as an error.
      ++tests;
      ++errors;
      // The latest attempt's reason says why (a cancel reason, the build error, lost).
      std::string why;
      if (auto a = cell.find("attempts"); a != cell.end() && a->is_array() && !a->empty()) {
        why = Str(a->back(), "reason");
      }
      cases += "    <testcase classname=\"gatehouse." + Xml(family) + "\" name=\"" +
               Xml(ShortId(cell) + ".cell") + "\" time=\"0\">\n      <error message=\"" +
               Xml("cell " + status + (why.empty() ? "" : ": " + why)) +
               "\"/>\n    </testcase>\n";
    }
    xml += "  <testsuite name=\"" + Xml("cell " + Str(cell, "id") + " " + family +
                                        (branch.empty() ? "" : " @" + branch)) +
           "\" tests=\"" + std::to_string(tests) + "\" failures=\"" + std::to_string(failures) +
           "\" errors=\"" + std::to_string(errors) + "\" skipped=\"" + std::to_string(skipped) +
           "\" time=\"" + Fixed3(total_s) + "\">\n" + cases + "  </testsuite>\n";
  }
  return xml + "</testsuites>\n";
}

}  // namespace gatehouse::cli
