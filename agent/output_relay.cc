// The worker's standard output relay (docs/protocols.md §4).
#include "agent/output_relay.h"

#include <nlohmann/json.hpp>

namespace gatehouse::agent {
namespace {

using nlohmann::json;

constexpr size_t kMaxEventLineBytes = 4 * 1024 * 1024;

}  // namespace

WorkerStdoutRelay::WorkerStdoutRelay(AttemptSink& sink, int64_t attempt_id)
    : sink_(sink), attempt_id_(attempt_id), text_(sink, attempt_id, kWorkerStdoutStream) {}

WorkerStdoutRelay::WorkerStdoutRelay(AttemptSink& sink, int64_t attempt_id, int64_t* next_seq,
                                     std::string_view text_stream)
    : sink_(sink), attempt_id_(attempt_id), text_(sink, attempt_id, text_stream),
      next_seq_(next_seq) {}

void WorkerStdoutRelay::Feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      if (overlong_) {
        text_.Write(bytes);
      } else {
        partial_.append(bytes);
        if (partial_.size() > kMaxEventLineBytes) {
          text_.Write(partial_);  // too long to be an event: relay it as text
          partial_.clear();
          overlong_ = true;
        }
      }
      return;
    }
    const std::string_view piece = bytes.substr(0, newline);
    bytes.remove_prefix(newline + 1);
    if (overlong_) {
      text_.Write(std::string(piece) + "\n");
      overlong_ = false;
    } else if (partial_.empty()) {
      Line(piece);
    } else {
      partial_.append(piece);
      Line(partial_);
      partial_.clear();
    }
  }
}

void WorkerStdoutRelay::Finish() {
  if (overlong_) {
    text_.Write("\n");
    overlong_ = false;
  } else if (!partial_.empty()) {
    Line(partial_);
    partial_.clear();
  }
}

void WorkerStdoutRelay::Line(std::string_view line) {
  std::string_view body = line;
  if (!body.empty() && body.back() == '\r') body.remove_suffix(1);
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("event")) {
    text_.Write(std::string(line) + "\n");
    return;
  }
  const json& event = parsed["event"];
  if (event.is_string()) {
    const std::string& name = event.get_ref<const std::string&>();
    const auto phase = parsed.find("phase");
    if (name == "phase_start" && phase != parsed.end() && phase->is_string()) {
      current_phase_ = phase->get<std::string>();
    } else if (name == "phase_end") {
      current_phase_.clear();
    }
  }
  if (event.is_string() && event.get_ref<const std::string&>() == "run_end") {
    saw_run_end_ = true;
    const auto status = parsed.find("status");
    run_end_status_ = status != parsed.end() && status->is_string() ? status->get<std::string>()
                                                                     : std::string();
  }
  sink_.Event(attempt_id_, (*next_seq_)++, body);
  ++events_sent_;
}

namespace {

// A kept line: surrounding blanks and CR removed, a long one cut to its end ("...<end>").
std::string Clean(std::string_view line, size_t max_bytes) {
  const size_t first = line.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return "";
  line = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
  if (line.size() > max_bytes) return "..." + std::string(line.substr(line.size() - max_bytes));
  return std::string(line);
}

}  // namespace

void TailLines::Push(std::string line) {
  line = Clean(line, kMaxLineBytes);
  if (line.empty()) return;
  if (lines_.size() == kMaxLines) lines_.erase(lines_.begin());
  lines_.push_back(std::move(line));
}

void TailLines::Feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    const std::string_view piece = bytes.substr(0, newline);
    if (partial_.size() < 4 * kMaxLineBytes) {
      partial_.append(piece);
    } else {  // an endless line: keep its end
      partial_ = partial_.substr(partial_.size() - kMaxLineBytes) + std::string(piece);
    }
    if (newline == std::string_view::npos) return;
    bytes.remove_prefix(newline + 1);
    Push(std::move(partial_));
    partial_.clear();
  }
}

std::string TailLines::Last() const {
  std::string last = Clean(partial_, kMaxLineBytes);
  if (!last.empty() || lines_.empty()) return last;
  return lines_.back();
}

std::string TailLines::Summary() const {
  std::vector<std::string> all = lines_;
  std::string last = Clean(partial_, kMaxLineBytes);
  if (!last.empty()) {
    if (all.size() == kMaxLines) all.erase(all.begin());
    all.push_back(std::move(last));
  }
  std::string out;
  for (const std::string& line : all) {
    if (!out.empty()) out += " | ";
    out += line;
  }
  return out;
}

}  // namespace gatehouse::agent
