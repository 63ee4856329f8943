// Worker launch and output relay (docs/protocols.md §3, §4).
#include "agent/worker_launcher.h"

#include <fstream>

namespace gatehouse::agent {
namespace {

using nlohmann::json;

constexpr size_t kMaxEventLineBytes = 4 * 1024 * 1024;

AttemptEndReport ErrorEnd(int64_t attempt_id, int64_t events, std::string reason) {
  AttemptEndReport end;
  end.attempt_id = attempt_id;
  end.seq = events + 1;
  end.outcome = std::string(kOutcomeError);
  end.reason = std::move(reason);
  return end;
}

Status WriteFile(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::Internal("cannot write " + tmp.string());
    out << text;
    if (!out.flush()) return Status::Internal("cannot write " + tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::Internal("cannot rename " + tmp.string() + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

json MakeRunSpec(const WorkerLaunch& launch) {
  json run = launch.spec;
  run["attempt"] = {
      {"id", launch.attempt_id},
      {"dir", launch.attempt_dir.string()},
      {"checkout",
       {{"head", launch.checkout.head},
        {"clean", launch.checkout.clean},
        {"path", launch.checkout.path.string()}}},
      {"agent", launch.agent_name},
  };
  return run;
}

Result<std::vector<std::pair<std::string, std::string>>> WorkerEnvironment(const json& spec) {
  std::vector<std::pair<std::string, std::string>> env;
  const auto it = spec.find("env");
  if (it != spec.end() && !it->is_null()) {
    if (!it->is_object()) {
      return Status::InvalidArgument("spec field 'env' must be an object, got " + it->dump());
    }
    for (const auto& [key, value] : it->items()) {
      if (key.empty() || key.find('=') != std::string::npos || key.find('\0') != std::string::npos) {
        return Status::InvalidArgument("spec field 'env': invalid variable name " + json(key).dump());
      }
      if (!value.is_string()) {
        return Status::InvalidArgument("spec field 'env." + key + "' must be a string, got " +
                                       value.dump());
      }
      env.emplace_back(key, value.get<std::string>());
    }
  }
  env.emplace_back("RANK", "0");
  env.emplace_back("WORLD_SIZE", "1");
  env.emplace_back("LOCAL_RANK", "0");
  return env;
}

WorkerStdoutRelay::WorkerStdoutRelay(AttemptSink& sink, int64_t attempt_id)
    : sink_(sink), attempt_id_(attempt_id), text_(sink, attempt_id, kWorkerStdoutStream) {}

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
  if (event.is_string() && event.get_ref<const std::string&>() == "run_end") saw_run_end_ = true;
  sink_.Event(attempt_id_, next_seq_++, body);
}

AttemptEndReport RunWorker(const WorkerLaunch& launch, AttemptSink& sink, CancelToken cancel) {
  const int64_t id = launch.attempt_id;
  auto env = WorkerEnvironment(launch.spec);
  if (!env.ok()) return ErrorEnd(id, 0, "invalid spec: " + env.status().message());

  std::error_code ec;
  std::filesystem::create_directories(launch.attempt_dir, ec);
  if (ec) {
    return ErrorEnd(id, 0, "cannot create attempt dir " + launch.attempt_dir.string() + ": " +
                               ec.message());
  }
  const std::filesystem::path run_spec = launch.attempt_dir / "run.json";
  if (Status s = WriteFile(run_spec, MakeRunSpec(launch).dump(2) + "\n"); !s.ok()) {
    return ErrorEnd(id, 0, s.message());
  }

  ProcessSpec spec;
  spec.exe = launch.worker;
  spec.args = {"--run-spec", run_spec.string()};
  for (const auto& plugin : launch.plugins) {
    spec.args.push_back("--plugin");
    spec.args.push_back(plugin.string());
  }
  spec.cwd = launch.attempt_dir;
  spec.env = std::move(env).value();

  WorkerStdoutRelay relay(sink, id);
  LogStream stderr_log(sink, id, kWorkerStream);
  auto exit = RunProcess(
      spec, [&](std::string_view bytes) { relay.Feed(bytes); },
      [&](std::string_view bytes) { stderr_log.Write(bytes); }, cancel);
  relay.Finish();
  if (!exit.ok()) {
    return ErrorEnd(id, relay.events_sent(), "cannot start worker: " + exit.status().message());
  }
  if (relay.saw_run_end()) {
    AttemptEndReport end;
    end.attempt_id = id;
    end.seq = relay.events_sent() + 1;
    end.outcome = std::string(kOutcomeFinished);
    end.exit_code = exit->exit_code;
    return end;
  }
  std::string reason = "worker " + exit->Describe() + " before run_end";
  if (cancel.requested()) reason += " (cancelled)";
  AttemptEndReport end = ErrorEnd(id, relay.events_sent(), std::move(reason));
  end.exit_code = exit->exit_code;
  return end;
}

}  // namespace gatehouse::agent
