// The artifact store of `gatehouse run`: content-addressed files in a directory, in the layout
// the agent's own cache uses (<root>/sha256/<hex>), so a reference bundle stored by the local
// reference run is the file its validation run fetches.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/artifact_channel.h"

namespace gatehouse::local {

/// An ArtifactChannel on `root`. Put copies the file to <root>/sha256/<hex> (kept if already
/// there) and records it; Get copies a stored blob out after checking its digest.
/// Threading: one thread (the attempt runner's).
class DirectoryArtifacts : public agent::ArtifactChannel {
 public:
  explicit DirectoryArtifacts(std::filesystem::path root) : root_(std::move(root)) {}

  /// Errors: NOT_FOUND for an unreadable `path`; INTERNAL when the copy cannot be written.
  Status Put(int64_t attempt_id, const std::string& name,
             const std::filesystem::path& path) override;
  /// Errors: NOT_FOUND when no blob `digest` is stored; DATA_LOSS when the stored bytes are not
  /// `size` bytes with that digest.
  Status Get(const std::string& digest, int64_t size, const std::filesystem::path& dest) override;

  /// What Put stored, in order: role "reference" for "reference/<file>" names (the inputs of a
  /// validation attempt), role "" otherwise.
  const std::vector<agent::InputFile>& stored() const { return stored_; }
  /// The blob of `digest` ("sha256:<hex>").
  std::filesystem::path BlobPath(const std::string& digest) const;

 private:
  std::filesystem::path root_;
  std::vector<agent::InputFile> stored_;
};

}  // namespace gatehouse::local
