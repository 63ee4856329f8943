// The store's checkpoint_facts and memory_peaks tables (migrations/0014_memory.sql).
#include <string>
#include <vector>

#include "controller/store/sqlite_statement.h"
#include "controller/store/store.h"

namespace gatehouse::controller {

Status Store::PutCheckpointFacts(const std::string& digest, const CheckpointFacts& facts) {
  std::lock_guard lock(mu_);
  return Stmt(*statements_,
              "INSERT OR REPLACE INTO checkpoint_facts(digest, bytes, dtype, element_bytes) "
              "VALUES (?, ?, ?, ?)")
      .Bind(1, digest)
      .Bind(2, facts.bytes)
      .Bind(3, facts.dtype)
      .Bind(4, int64_t{facts.element_bytes})
      .Exec();
}

Result<std::optional<CheckpointFacts>> Store::GetCheckpointFacts(const std::string& digest) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, "SELECT bytes, dtype, element_bytes FROM checkpoint_facts WHERE digest = ?");
  s.Bind(1, digest);
  if (!s.Step()) {
    GH_RETURN_IF_ERROR(s.status());
    return std::optional<CheckpointFacts>();
  }
  CheckpointFacts facts;
  facts.bytes = s.Int(0);
  facts.dtype = s.Text(1);
  facts.element_bytes = static_cast<int>(s.Int(2));
  return std::optional<CheckpointFacts>(facts);
}

Status Store::RecordMemoryPeak(const MeasuredPeak& peak) {
  std::lock_guard lock(mu_);
  return Stmt(*statements_,
              "INSERT OR REPLACE INTO memory_peaks(attempt_id, role, memory_key, estimate_bytes, "
              "peak_bytes, recorded_at) VALUES (?, ?, ?, ?, ?, ?)")
      .Bind(1, peak.attempt_id)
      .Bind(2, peak.role)
      .Bind(3, peak.memory_key)
      .Bind(4, peak.estimate_bytes)
      .Bind(5, peak.peak_bytes)
      .Bind(6, Now())
      .Exec();
}

Result<std::vector<MeasuredPeak>> Store::ListMemoryPeaks(int limit) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "SELECT attempt_id, role, memory_key, estimate_bytes, peak_bytes FROM "
         "(SELECT * FROM memory_peaks ORDER BY attempt_id DESC LIMIT ?) ORDER BY attempt_id");
  s.Bind(1, int64_t{limit});
  std::vector<MeasuredPeak> out;
  while (s.Step()) out.push_back({s.Int(0), s.Text(1), s.Text(2), s.Int(3), s.Int(4)});
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Result<int64_t> Store::AttemptPeakRss(int64_t attempt_id) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "SELECT MAX(CAST(value_json AS INTEGER)) FROM figures WHERE attempt_id = ? AND "
         "name IN ('peak_rss_bytes', 'rss_peak_bytes')");
  s.Bind(1, attempt_id);
  int64_t peak = 0;
  if (s.Step()) peak = s.Int(0);
  GH_RETURN_IF_ERROR(s.status());
  return peak;
}

}  // namespace gatehouse::controller
