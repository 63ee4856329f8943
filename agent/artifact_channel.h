// Artifacts between an agent and the controller's content-addressed store (docs/protocols.md
// §7): the interface the attempt runner uses and the transport implements (gRPC PutArtifact /
// GetArtifact in agent/agent_client.cc; tests use a directory).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/status.h"

namespace gatehouse::agent {

/// One input file of an assignment (Assignment.inputs).
struct InputFile {
  std::string role;    // "reference": a file of the reference bundle directory
  std::string name;    // its name in that directory
  std::string digest;  // "sha256:<hex>"
  int64_t size = 0;    // bytes
};

/// Threading: implementations are called from the attempt runner's thread only.
class ArtifactChannel {
 public:
  virtual ~ArtifactChannel() = default;
  /// Stores the file at `path` as artifact `name` of attempt `attempt_id` (its SHA-256 is
  /// computed here; the controller checks it). Errors: the transport's, or the controller's
  /// refusal (DATA_LOSS, RESOURCE_EXHAUSTED, PERMISSION_DENIED, ...) with its message.
  virtual Status Put(int64_t attempt_id, const std::string& name,
                     const std::filesystem::path& path) = 0;
  /// Writes blob `digest` to `dest` (replaced only once complete and verified). Errors:
  /// NOT_FOUND when the controller has no such blob; DATA_LOSS when the bytes received are not
  /// `size` bytes with that digest; the transport's otherwise.
  virtual Status Get(const std::string& digest, int64_t size,
                     const std::filesystem::path& dest) = 0;
};

}  // namespace gatehouse::agent
