// A recording AttemptSink for agent tests: keeps events, log streams (checking that each stream's
// offsets are contiguous from 0) and ends.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "agent/attempt_sink.h"

namespace gatehouse::agent {

class FakeAttemptSink : public AttemptSink {
 public:
  struct RecordedEvent {
    int64_t attempt_id;
    int64_t seq;
    std::string json;
  };
  struct RecordedChunk {
    int64_t offset;
    std::string data;
  };

  void Event(int64_t attempt_id, int64_t seq, std::string_view json) override {
    EXPECT_TRUE(ends.empty()) << "event after End";
    events.push_back({attempt_id, seq, std::string(json)});
  }
  void Log(int64_t attempt_id, std::string_view stream, int64_t offset,
           std::string_view data) override {
    EXPECT_TRUE(ends.empty()) << "log chunk after End";
    EXPECT_FALSE(data.empty());
    std::string& text = logs[std::string(stream)];
    EXPECT_EQ(offset, static_cast<int64_t>(text.size()))
        << "stream " << stream << " of attempt " << attempt_id << " has a gap or overlap";
    text.append(data);
    chunks[std::string(stream)].push_back({offset, std::string(data)});
  }
  void End(const AttemptEndReport& end) override { ends.push_back(end); }

  /// Everything written to `stream` (empty when nothing was).
  std::string LogText(const std::string& stream) const {
    const auto it = logs.find(stream);
    return it == logs.end() ? std::string() : it->second;
  }

  std::vector<RecordedEvent> events;
  std::map<std::string, std::string> logs;
  std::map<std::string, std::vector<RecordedChunk>> chunks;
  std::vector<AttemptEndReport> ends;
};

}  // namespace gatehouse::agent
