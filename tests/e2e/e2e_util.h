// Shared by the end-to-end tests: the adapter repository they validate and readers of the
// cell JSON (docs/protocols.md §1).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gatehouse::testing {

/// Runs git with a fixed identity in `repo`; a non-zero exit is a test failure (ASSERT).
void Git(const std::filesystem::path& repo, const std::vector<std::string>& args);

/// The adapter repository: models/ as its root, branch `main` as is, branch `rope-keys-bug`
/// with tools/mutations/rope_keys_unapplied.patch committed.
void MakeAdapterRepository(const std::filesystem::path& repo);

/// The phase named `name` of a cell object, or null.
const nlohmann::json* FindPhase(const nlohmann::json& cell, const std::string& name);

/// The numeric figure `name` of a phase object.
std::optional<double> Figure(const nlohmann::json& phase, const std::string& name);

}  // namespace gatehouse::testing
