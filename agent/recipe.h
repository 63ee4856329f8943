// The build recipe an adaptation repository carries at its root (docs/protocols.md §5).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gatehouse::agent {

inline constexpr std::string_view kRecipeFileName = "gatehouse.recipe.json";

/// A validated recipe. Every path is relative and free of "..".
struct Recipe {
  int recipe_version = 1;
  std::string build_system = "cmake";
  /// Relative to the repository root; "." when absent.
  std::string source_dir = ".";
  /// Extra configure arguments, each one argv entry starting with "-D".
  std::vector<std::string> cmake_args;
  /// The CMake target to build; "all" when absent.
  std::string target = "all";
  /// Shared libraries to pass to the worker, relative to the build directory (at least one;
  /// C++ lane only).
  std::vector<std::string> plugins;
  /// "cpp" (a CMake-built plugin) or "python" (a Python adapter installed with pip and run by
  /// the worker's Python lane, docs/protocols.md §9).
  std::string lane = "cpp";
  /// Python lane: the adapters' entries, "package.module:ATTRIBUTE" naming a ModelSpec.
  std::vector<std::string> entries;
};

/// Parses and validates recipe text without touching the filesystem. Unknown members (at the
/// top level and in "build") are rejected. Errors: INVALID_ARGUMENT with a message that starts
/// "gatehouse.recipe.json: " and names the field and the offending value.
Result<Recipe> ParseRecipe(std::string_view text);

/// Reads `<checkout_root>/gatehouse.recipe.json`, parses it, and checks that source_dir names a
/// directory inside the checkout once symlinks are resolved.
/// Errors: NOT_FOUND "gatehouse.recipe.json not found at <commit>"; INVALID_ARGUMENT as
/// ParseRecipe, or for a source_dir that is missing or leaves the checkout.
Result<Recipe> LoadRecipe(const std::filesystem::path& checkout_root, std::string_view commit);

}  // namespace gatehouse::agent
