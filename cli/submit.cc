#include "cli/submit.h"

#include <algorithm>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

namespace gatehouse::cli {

Result<ApiResponse> PostCell(const PostCellOptions& options, std::ostream& progress) {
  using std::chrono::steady_clock;
  auto now = [&] { return options.now ? options.now() : steady_clock::now(); };
  std::string said;
  while (true) {
    Result<ApiResponse> r = options.post();
    if (!r.ok() || r->status != 202) return r;
    const nlohmann::json answer = nlohmann::json::parse(r->body, nullptr, false);
    auto text = [&answer](const char* key) {
      auto it = answer.is_object() ? answer.find(key) : answer.end();
      return it != answer.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (text("state") != "resolving") return r;
    const std::string reason = text("reason");
    if (reason != said) {
      progress << "gatehouse: resolving: " << reason << "\n";
      progress.flush();
      said = reason;
    }
    int wait_s = 1;
    if (auto it = answer.find("retry_after_s"); it != answer.end() && it->is_number_integer()) {
      wait_s = std::clamp(it->get<int>(), 1, 60);
    }
    const auto wait = std::chrono::seconds(wait_s);
    if (now() + wait > options.deadline) {
      return Status::DeadlineExceeded("still resolving: " + reason);
    }
    if (options.sleep) {
      options.sleep(wait);
    } else {
      std::this_thread::sleep_for(wait);
    }
  }
}

}  // namespace gatehouse::cli
