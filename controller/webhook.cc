#include "controller/webhook.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "controller/attempt_state.h"
#include "controller/store/store.h"

namespace gatehouse::controller {

namespace {

using nlohmann::json;

/// Deliveries handled per pass: a backlog drains over passes, each one short.
constexpr int kBatch = 32;

std::string Hex(const unsigned char* bytes, unsigned int n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kDigits[bytes[i] >> 4]);
    out.push_back(kDigits[bytes[i] & 0xf]);
  }
  return out;
}

}  // namespace

std::string WebhookSignature(std::string_view secret, std::string_view body) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(body.data()), body.size(), mac, &mac_len);
  return "sha256=" + Hex(mac, mac_len);
}

std::string RedactedUrl(std::string_view url) {
  std::string out(url);
  const size_t scheme = out.find("://");
  const size_t host_start = scheme == std::string::npos ? 0 : scheme + 3;
  const size_t path_start = out.find_first_of("/?#", host_start);
  const size_t at = out.rfind('@', path_start == std::string::npos ? out.size() : path_start);
  if (at != std::string::npos && at >= host_start) out.replace(host_start, at - host_start, "***");
  if (const size_t q = out.find_first_of("?#", host_start); q != std::string::npos) {
    out.replace(q + 1, std::string::npos, "***");
  }
  return out;
}

std::chrono::milliseconds WebhookBackoff(const WebhookConfig& config, int tries_made) {
  auto wait = config.first_backoff;
  for (int i = 1; i < tries_made && wait < config.max_backoff; ++i) wait *= 2;
  return std::min(wait, config.max_backoff);
}

WebhookSender::WebhookSender(Store& store, WebhookConfig config, WebhookPoster post, Clock clock)
    : store_(store), config_(std::move(config)), post_(std::move(post)), clock_(std::move(clock)) {}

Result<std::string> WebhookSender::Payload(const WebhookDelivery& d) {
  GH_ASSIGN_OR_RETURN(std::optional<CellRecord> cell, store_.GetCell(d.cell_id));
  if (!cell) return Status::NotFound("cell " + d.cell_id + " not found");
  GH_ASSIGN_OR_RETURN(AttemptRecord attempt, store_.GetAttempt(d.attempt_id));
  GH_ASSIGN_OR_RETURN(std::vector<PhaseRecord> phases, store_.ListPhases(d.attempt_id));
  const json spec = json::parse(cell->spec_json, nullptr, /*allow_exceptions=*/false);
  std::string kind = "validation";
  if (spec.is_object() && spec.contains("kind") && spec["kind"].is_string()) {
    kind = spec["kind"].get<std::string>();
  }
  json phase_list = json::array();
  for (const PhaseRecord& p : phases) {
    phase_list.push_back({{"phase", p.phase}, {"status", p.status}, {"reason", p.reason}});
  }
  const std::string state(AttemptStateName(attempt.state));
  json body = {
      {"event", "cell.ended"},
      {"delivery", d.id},
      {"verdict", state},
      {"cell",
       {{"id", cell->id},
        {"kind", kind},
        {"model_family", cell->model_family},
        {"repository", cell->repository},
        {"branch", cell->branch},
        {"commit", cell->commit_sha},
        {"submitter", cell->submitter},
        {"created_at", cell->created_at},
        {"url", "/api/v1/cells/" + cell->id},
        {"report_url", "/api/v1/cells/" + cell->id + "/report"}}},
      {"attempt",
       {{"id", attempt.id},
        {"number", attempt.number},
        {"state", state},
        {"run_status", attempt.run_status},
        {"reason", attempt.reason},
        {"agent", attempt.agent_id},
        {"started_at", attempt.started_at},
        {"ended_at", attempt.ended_at}}},
      {"phases", phase_list}};
  return body.dump();
}

int WebhookSender::RunOnce() {
  const std::string now = FormatTimestamp(clock_());
  auto due = store_.DueWebhookDeliveries(now, kBatch);
  if (!due.ok()) {
    spdlog::error("webhook: {}", due.status().ToString());
    return 0;
  }
  int handled = 0;
  for (const WebhookDelivery& d : *due) {
    if (stopping_.load()) break;  // shutdown: the rest stay due for the next start
    ++handled;
    WebhookTry t;
    // A try that fails: retried after the backoff until max_tries, then failed.
    auto failed_try = [&](std::string error) {
      const int tries = d.tries + 1;
      t.error = std::move(error);
      if (tries >= config_.max_tries) {
        t.state = "failed";
        spdlog::warn("webhook delivery {} (cell {}, attempt {}) failed after {} tries: {}", d.id,
                     d.cell_id, d.attempt_id, tries, t.error);
      } else {
        t.state = "pending";
        t.next_try_at = FormatTimestamp(clock_() + WebhookBackoff(config_, tries));
      }
    };
    if (config_.url.empty() || d.retried) {
      t.state = "skipped";
      t.counts = false;
      t.error = d.retried ? "attempt lost and retried: its cell goes on"
                          : "no webhook configured";
    } else if (auto body = Payload(d); !body.ok()) {
      // Counted like a failed POST, so an unreadable row cannot hold the queue's head.
      failed_try("the delivery's body could not be built: " + body.status().ToString());
    } else {
      WebhookRequest request;
      request.url = config_.url;
      request.body = *body;
      request.timeout = config_.timeout;
      request.headers = {{"Content-Type", "application/json"},
                         {"User-Agent", "gatehouse-controller"},
                         {"X-Gatehouse-Event", "cell.ended"},
                         {"X-Gatehouse-Delivery", std::to_string(d.id)}};
      if (!config_.secret.empty()) {
        request.headers.emplace_back("X-Gatehouse-Signature-256",
                                     WebhookSignature(config_.secret, *body));
      }
      const Result<int> answer = post_(request);
      if (answer.ok()) t.status = *answer;
      if (answer.ok() && *answer >= 200 && *answer < 300) {
        t.state = "delivered";
      } else {
        failed_try(answer.ok() ? "receiver answered HTTP " + std::to_string(*answer)
                               : answer.status().ToString());
      }
    }
    if (Status s = store_.RecordWebhookTry(d.id, t); !s.ok()) {
      spdlog::error("webhook delivery {}: {}", d.id, s.ToString());
    }
  }
  return handled;
}

}  // namespace gatehouse::controller
