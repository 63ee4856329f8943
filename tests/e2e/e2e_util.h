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

/// A git repository at `repo` holding the Python-lane reference adapters (adapters/python: the
/// gh_archon package and its pyproject.toml) with a gatehouse.recipe.json for lane "python"
/// naming the llama SPEC: branch `main` as is, branch `gate-up-swapped` with the llama name
/// table mapping the checkpoint's gate_proj to w3 and up_proj to w1 (both ways, so load's round
/// trip holds and the numbers are wrong).
void MakePythonAdapterRepository(const std::filesystem::path& repo);

class Daemon;

/// The HTTP and gRPC ports a starting controller prints ("<kind> listening on 127.0.0.1:P"),
/// waiting up to 30 s for each; nullopt (and the caller fails) when it does not print them.
struct ControllerPorts {
  int http = 0;
  int grpc = 0;
};
std::optional<ControllerPorts> WaitForControllerPorts(Daemon& controller);

/// Runs `gatehouse-controller --db DB tokens create ARGS...` and returns the secret it prints
/// ("" and a test failure when it fails).
std::string CreateToken(const std::string& bin_dir, const std::string& db,
                        const std::vector<std::string>& create_args);

/// Writes `text` to `path` (truncating); a failure is a test failure.
void WriteTextFile(const std::filesystem::path& path, const std::string& text);

/// The phase named `name` of a cell object, or null.
const nlohmann::json* FindPhase(const nlohmann::json& cell, const std::string& name);

/// The numeric figure `name` of a phase object.
std::optional<double> Figure(const nlohmann::json& phase, const std::string& name);

/// The text figure `name` of a phase object ("" when it has none).
std::string TextFigure(const nlohmann::json& phase, const std::string& name);

}  // namespace gatehouse::testing
