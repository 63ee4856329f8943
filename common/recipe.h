// The build recipe an adaptation repository carries at its root (docs/protocols.md §5). Read
// by the agent (from its checkout, to build) and by the controller (from its mirror at the
// frozen commit, to refuse a cell whose model_family the adapter does not declare).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gatehouse {

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
  /// The model_family names the adapter serves ("families"; optional, both lanes). Empty: not
  /// declared, and a cell's model_family is first checked by the worker's config gate.
  std::vector<std::string> families;

  /// True when the recipe declares no families or declares `family`.
  bool Serves(std::string_view family) const;
};

/// Parses and validates recipe text without touching the filesystem. Unknown members (at the
/// top level and in "build") are rejected. Errors: INVALID_ARGUMENT with a message that starts
/// "gatehouse.recipe.json: " and names the field and the offending value.
Result<Recipe> ParseRecipe(std::string_view text);

/// OK when `recipe` serves `family` (Recipe::Serves); else INVALID_ARGUMENT naming the field, the
/// value, the commit and the declared families: "field 'model_family' = \"olmo-2\": the adapter
/// at <commit> declares the families \"olmo2\", \"llama\" (gatehouse.recipe.json)".
Status CheckServes(const Recipe& recipe, std::string_view family, std::string_view commit);

/// Reads `<checkout_root>/gatehouse.recipe.json`, parses it, and checks that source_dir names a
/// directory inside the checkout once symlinks are resolved.
/// Errors: NOT_FOUND "gatehouse.recipe.json not found at <commit>"; INVALID_ARGUMENT as
/// ParseRecipe, or for a source_dir that is missing or leaves the checkout.
Result<Recipe> LoadRecipe(const std::filesystem::path& checkout_root, std::string_view commit);

}  // namespace gatehouse
