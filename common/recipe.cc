// Recipe parsing and validation (docs/protocols.md §5).
#include "common/recipe.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace gatehouse {
namespace {

using nlohmann::json;

Status Invalid(std::string_view field, const std::string& what) {
  return Status::InvalidArgument(std::string(kRecipeFileName) + ": field '" + std::string(field) +
                                 "': " + what);
}

std::string Quote(std::string_view s) { return json(std::string(s)).dump(); }

Status CheckKnownMembers(const json& object, std::string_view where,
                         const std::set<std::string>& known) {
  for (const auto& [key, value] : object.items()) {
    if (known.count(key) == 0) {
      const std::string field = where.empty() ? key : std::string(where) + "." + key;
      return Invalid(field, "unknown field");
    }
  }
  return Status::Ok();
}

Result<std::string> GetString(const json& object, const std::string& key, std::string_view field,
                              std::string fallback, bool required) {
  const auto it = object.find(key);
  if (it == object.end()) {
    if (required) return Invalid(field, "is required");
    return fallback;
  }
  if (!it->is_string()) return Invalid(field, "must be a string, got " + it->dump());
  std::string value = it->get<std::string>();
  if (value.find('\0') != std::string::npos) return Invalid(field, "contains a NUL byte");
  return value;
}

Result<std::vector<std::string>> GetStringArray(const json& object, const std::string& key,
                                                std::string_view field, bool required) {
  const auto it = object.find(key);
  if (it == object.end()) {
    if (required) return Invalid(field, "is required");
    return std::vector<std::string>{};
  }
  if (!it->is_array()) return Invalid(field, "must be an array of strings, got " + it->dump());
  std::vector<std::string> values;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& element = (*it)[i];
    const std::string element_field = std::string(field) + "[" + std::to_string(i) + "]";
    if (!element.is_string()) return Invalid(element_field, "must be a string, got " + element.dump());
    std::string value = element.get<std::string>();
    if (value.find('\0') != std::string::npos) return Invalid(element_field, "contains a NUL byte");
    values.push_back(std::move(value));
  }
  return values;
}

// A path that stays below the directory it is relative to: not empty, not absolute, no "..".
Status CheckRelativePath(std::string_view field, const std::string& value) {
  if (value.empty()) return Invalid(field, "must not be empty");
  const std::filesystem::path path(value);
  if (path.is_absolute() || path.has_root_name() || path.has_root_directory()) {
    return Invalid(field, "must be a relative path, got " + Quote(value));
  }
  for (const auto& part : path) {
    if (part == "..") return Invalid(field, "must not contain \"..\", got " + Quote(value));
  }
  return Status::Ok();
}

Status CheckTarget(const std::string& target) {
  if (target.empty()) return Invalid("build.target", "must not be empty");
  if (target.front() == '-') {
    return Invalid("build.target", "must not start with '-', got " + Quote(target));
  }
  for (const char c : target) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
                    c == '.' || c == '+' || c == '/';
    if (!ok) return Invalid("build.target", "has a character outside [A-Za-z0-9_.+/-]: " + Quote(target));
  }
  return Status::Ok();
}

// "package.module:ATTRIBUTE": dotted Python identifiers, one attribute.
Status CheckEntry(std::string_view field, const std::string& entry) {
  const size_t colon = entry.find(':');
  auto identifiers = [](std::string_view dotted) {
    if (dotted.empty()) return false;
    size_t start = 0;
    while (true) {
      const size_t dot = dotted.find('.', start);
      const std::string_view part = dotted.substr(start, dot == std::string_view::npos
                                                             ? std::string_view::npos
                                                             : dot - start);
      if (part.empty() || std::isdigit(static_cast<unsigned char>(part.front()))) return false;
      for (const char c : part) {
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
      }
      if (dot == std::string_view::npos) return true;
      start = dot + 1;
    }
  };
  if (colon == std::string::npos || !identifiers(std::string_view(entry).substr(0, colon)) ||
      !identifiers(std::string_view(entry).substr(colon + 1)) ||
      entry.find('.', colon) != std::string::npos) {
    return Invalid(field, "must be \"package.module:ATTRIBUTE\" (Python identifiers), got " +
                              Quote(entry));
  }
  return Status::Ok();
}

// A model_family name as a cell spec takes it: [A-Za-z0-9_.-], starting with a letter or digit,
// at most 128 bytes (common/cell_spec.cc ReadFamily).
Status CheckFamilyName(std::string_view field, const std::string& name) {
  const bool ok = !name.empty() && name.size() <= 128 &&
                  std::isalnum(static_cast<unsigned char>(name[0])) &&
                  std::all_of(name.begin(), name.end(), [](unsigned char ch) {
                    return std::isalnum(ch) || ch == '_' || ch == '-' || ch == '.';
                  });
  if (!ok) return Invalid(field, "must be a model_family name ([A-Za-z0-9_.-]), got " + Quote(name));
  return Status::Ok();
}

// The Python lane's build: {"system": "pip", "source_dir": "<dir with pyproject.toml>"}.
Result<Recipe> ParsePipBuild(const json& build, Recipe recipe) {
  GH_RETURN_IF_ERROR(CheckKnownMembers(build, "build", {"system", "source_dir"}));
  GH_ASSIGN_OR_RETURN(recipe.source_dir,
                      GetString(build, "source_dir", "build.source_dir", ".", false));
  GH_RETURN_IF_ERROR(CheckRelativePath("build.source_dir", recipe.source_dir));
  recipe.target.clear();
  return recipe;
}

Result<Recipe> ParseBuild(const json& build, Recipe recipe) {
  if (!build.is_object()) return Invalid("build", "must be an object, got " + build.dump());
  if (recipe.lane == "python") {
    GH_ASSIGN_OR_RETURN(recipe.build_system,
                        GetString(build, "system", "build.system", "", /*required=*/true));
    if (recipe.build_system != "pip") {
      return Invalid("build.system", "must be \"pip\" for lane \"python\", got " +
                                         Quote(recipe.build_system));
    }
    return ParsePipBuild(build, std::move(recipe));
  }
  GH_RETURN_IF_ERROR(
      CheckKnownMembers(build, "build", {"system", "source_dir", "cmake_args", "target"}));

  GH_ASSIGN_OR_RETURN(recipe.build_system,
                      GetString(build, "system", "build.system", "", /*required=*/true));
  if (recipe.build_system != "cmake") {
    return Invalid("build.system", "must be \"cmake\", got " + Quote(recipe.build_system));
  }

  GH_ASSIGN_OR_RETURN(recipe.source_dir,
                      GetString(build, "source_dir", "build.source_dir", ".", false));
  GH_RETURN_IF_ERROR(CheckRelativePath("build.source_dir", recipe.source_dir));

  GH_ASSIGN_OR_RETURN(recipe.cmake_args,
                      GetStringArray(build, "cmake_args", "build.cmake_args", false));
  for (size_t i = 0; i < recipe.cmake_args.size(); ++i) {
    const std::string& arg = recipe.cmake_args[i];
    if (arg.size() < 3 || arg.rfind("-D", 0) != 0) {
      return Invalid("build.cmake_args[" + std::to_string(i) + "]",
                     "must start with \"-D\" and name a variable, got " + Quote(arg));
    }
  }

  GH_ASSIGN_OR_RETURN(recipe.target, GetString(build, "target", "build.target", "all", false));
  GH_RETURN_IF_ERROR(CheckTarget(recipe.target));
  return recipe;
}

}  // namespace

Result<Recipe> ParseRecipe(std::string_view text) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string(kRecipeFileName) + ": not valid JSON: " + e.what());
  }
  if (!doc.is_object()) {
    return Status::InvalidArgument(std::string(kRecipeFileName) + ": must be a JSON object");
  }
  GH_RETURN_IF_ERROR(CheckKnownMembers(
      doc, "", {"recipe_version", "build", "plugins", "lane", "entries", "families"}));

  Recipe recipe;
  const auto version = doc.find("recipe_version");
  if (version == doc.end()) return Invalid("recipe_version", "is required");
  if (!version->is_number_integer() || version->get<int64_t>() != 1) {
    return Invalid("recipe_version", "must be 1, got " + version->dump());
  }
  GH_ASSIGN_OR_RETURN(recipe.lane, GetString(doc, "lane", "lane", "cpp", false));
  if (recipe.lane != "cpp" && recipe.lane != "python") {
    return Invalid("lane", "must be \"cpp\" or \"python\", got " + Quote(recipe.lane));
  }

  GH_ASSIGN_OR_RETURN(recipe.families, GetStringArray(doc, "families", "families", false));
  if (doc.contains("families") && recipe.families.empty()) {
    return Invalid("families", "must name at least one family when present");
  }
  for (size_t i = 0; i < recipe.families.size(); ++i) {
    GH_RETURN_IF_ERROR(CheckFamilyName("families[" + std::to_string(i) + "]", recipe.families[i]));
  }

  const auto build = doc.find("build");
  if (build == doc.end()) return Invalid("build", "is required");
  GH_ASSIGN_OR_RETURN(recipe, ParseBuild(*build, std::move(recipe)));

  if (recipe.lane == "python") {
    if (doc.contains("plugins")) return Invalid("plugins", "is for lane \"cpp\" only");
    GH_ASSIGN_OR_RETURN(recipe.entries, GetStringArray(doc, "entries", "entries", true));
    if (recipe.entries.empty()) return Invalid("entries", "must name at least one entry");
    for (size_t i = 0; i < recipe.entries.size(); ++i) {
      GH_RETURN_IF_ERROR(CheckEntry("entries[" + std::to_string(i) + "]", recipe.entries[i]));
    }
    return recipe;
  }
  if (doc.contains("entries")) return Invalid("entries", "is for lane \"python\" only");

  GH_ASSIGN_OR_RETURN(recipe.plugins, GetStringArray(doc, "plugins", "plugins", true));
  if (recipe.plugins.empty()) return Invalid("plugins", "must name at least one plugin");
  for (size_t i = 0; i < recipe.plugins.size(); ++i) {
    GH_RETURN_IF_ERROR(
        CheckRelativePath("plugins[" + std::to_string(i) + "]", recipe.plugins[i]));
  }
  return recipe;
}

bool Recipe::Serves(std::string_view family) const {
  return families.empty() || std::find(families.begin(), families.end(), family) != families.end();
}

Status CheckServes(const Recipe& recipe, std::string_view family, std::string_view commit) {
  if (recipe.Serves(family)) return Status::Ok();
  std::string declared;
  for (const std::string& f : recipe.families) declared += (declared.empty() ? "" : ", ") + Quote(f);
  return Status::InvalidArgument("field 'model_family' = " + Quote(family) + ": the adapter at " +
                                 std::string(commit) + " declares the families " + declared + " (" +
                                 std::string(kRecipeFileName) + ")");
}

Result<Recipe> LoadRecipe(const std::filesystem::path& checkout_root, std::string_view commit) {
  const std::filesystem::path file = checkout_root / kRecipeFileName;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    return Status::NotFound(std::string(kRecipeFileName) + " not found at " + std::string(commit));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  GH_ASSIGN_OR_RETURN(Recipe recipe, ParseRecipe(text.str()));

  // "inside the repo" after symlinks: a checked-in symlink may not lead out of the checkout.
  const std::filesystem::path root = std::filesystem::weakly_canonical(checkout_root, ec);
  const std::filesystem::path source =
      std::filesystem::weakly_canonical(checkout_root / recipe.source_dir, ec);
  if (ec || !std::filesystem::is_directory(source, ec)) {
    return Invalid("build.source_dir",
                   "names no directory in the repository at " + std::string(commit) + ": " +
                       Quote(recipe.source_dir));
  }
  const auto [root_end, unused] = std::mismatch(root.begin(), root.end(), source.begin(), source.end());
  if (root_end != root.end()) {
    return Invalid("build.source_dir", "leads outside the repository: " + Quote(recipe.source_dir));
  }
  return recipe;
}

}  // namespace gatehouse
