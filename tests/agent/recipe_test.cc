// Tests of gatehouse.recipe.json parsing and validation (docs/protocols.md §5).
#include "common/recipe.h"

#include <gtest/gtest.h>

#include "agent_test_util.h"

namespace gatehouse::agent {
namespace {

using testing::TempDir;
using testing::WriteFile;

constexpr const char* kFullRecipe = R"({
  "recipe_version": 1,
  "build": {
    "system": "cmake",
    "source_dir": "models",
    "cmake_args": ["-DCMAKE_BUILD_TYPE=Release", "-DFOO=a b"],
    "target": "gatehouse_models"
  },
  "plugins": ["libgatehouse_models.so", "sub/libextra.so"]
})";

// Verifies that a complete recipe yields every field as written.
TEST(RecipeTest, ParsesValidRecipe) {
  auto recipe = ParseRecipe(kFullRecipe);
  ASSERT_TRUE(recipe.ok()) << recipe.status().ToString();
  EXPECT_EQ(recipe->recipe_version, 1);
  EXPECT_EQ(recipe->build_system, "cmake");
  EXPECT_EQ(recipe->source_dir, "models");
  EXPECT_EQ(recipe->cmake_args,
            (std::vector<std::string>{"-DCMAKE_BUILD_TYPE=Release", "-DFOO=a b"}));
  EXPECT_EQ(recipe->target, "gatehouse_models");
  EXPECT_EQ(recipe->plugins, (std::vector<std::string>{"libgatehouse_models.so", "sub/libextra.so"}));
}

// Verifies the defaults of the optional build fields: source_dir ".", no args, target "all".
TEST(RecipeTest, AppliesDefaults) {
  auto recipe = ParseRecipe(
      R"({"recipe_version":1,"build":{"system":"cmake"},"plugins":["libp.so"]})");
  ASSERT_TRUE(recipe.ok()) << recipe.status().ToString();
  EXPECT_EQ(recipe->source_dir, ".");
  EXPECT_TRUE(recipe->cmake_args.empty());
  EXPECT_EQ(recipe->target, "all");
}

// Verifies that the example recipe of the in-tree models/ folder is valid.
TEST(RecipeTest, AcceptsTheModelsFolderRecipe) {
  auto recipe = LoadRecipe(std::filesystem::path(GATEHOUSE_SOURCE_DIR) / "models", "HEAD");
  ASSERT_TRUE(recipe.ok()) << recipe.status().ToString();
  EXPECT_EQ(recipe->target, "gatehouse_models");
}

// Verifies that an unknown member, at the top level or inside "build", is an error naming it.
TEST(RecipeTest, RejectsUnknownFieldByName) {
  auto top = ParseRecipe(
      R"({"recipe_version":1,"build":{"system":"cmake"},"plugins":["p.so"],"colour":"red"})");
  ASSERT_FALSE(top.ok());
  EXPECT_EQ(top.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(top.status().message().find("'colour'"), std::string::npos) << top.status().message();
  EXPECT_NE(top.status().message().find("unknown field"), std::string::npos);

  auto nested = ParseRecipe(
      R"({"recipe_version":1,"build":{"system":"cmake","jobs":4},"plugins":["p.so"]})");
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("'build.jobs'"), std::string::npos)
      << nested.status().message();
}

// Verifies that source_dir may not climb out of the repository or be absolute.
TEST(RecipeTest, RejectsDotDotAndAbsoluteSourceDir) {
  for (const char* dir : {"..", "../other", "a/../../b", "/abs/path"}) {
    const std::string text = std::string(R"({"recipe_version":1,"build":{"system":"cmake","source_dir":")") +
                             dir + R"("},"plugins":["p.so"]})";
    auto recipe = ParseRecipe(text);
    ASSERT_FALSE(recipe.ok()) << dir;
    EXPECT_NE(recipe.status().message().find("build.source_dir"), std::string::npos)
        << recipe.status().message();
  }
}

// Verifies that every cmake argument must be a -D definition, and the error names the index.
TEST(RecipeTest, RejectsCmakeArgWithoutDashD) {
  auto recipe = ParseRecipe(
      R"({"recipe_version":1,"build":{"system":"cmake","cmake_args":["-DOK=1","-GNinja"]},"plugins":["p.so"]})");
  ASSERT_FALSE(recipe.ok());
  EXPECT_NE(recipe.status().message().find("build.cmake_args[1]"), std::string::npos)
      << recipe.status().message();
  EXPECT_NE(recipe.status().message().find("-GNinja"), std::string::npos);
}

// Verifies the remaining structural checks: plugins paths, version, system, target, types.
TEST(RecipeTest, RejectsOtherMalformedRecipes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"recipe_version":1,"build":{"system":"cmake"},"plugins":["../x.so"]})", "plugins[0]"},
      {R"({"recipe_version":1,"build":{"system":"cmake"},"plugins":["/x.so"]})", "plugins[0]"},
      {R"({"recipe_version":1,"build":{"system":"cmake"},"plugins":[]})", "plugins"},
      {R"({"recipe_version":1,"build":{"system":"cmake"}})", "plugins"},
      {R"({"recipe_version":2,"build":{"system":"cmake"},"plugins":["p.so"]})", "recipe_version"},
      {R"({"build":{"system":"cmake"},"plugins":["p.so"]})", "recipe_version"},
      {R"({"recipe_version":1,"build":{"system":"make"},"plugins":["p.so"]})", "build.system"},
      {R"({"recipe_version":1,"build":{"system":"cmake","target":"--all"},"plugins":["p.so"]})",
       "build.target"},
      {R"({"recipe_version":1,"build":{"system":"cmake","cmake_args":"-DX=1"},"plugins":["p.so"]})",
       "build.cmake_args"},
      {R"({"recipe_version":1,"build":[],"plugins":["p.so"]})", "build"},
      {R"([1,2])", "JSON object"},
      {R"({"recipe_version":1,)", "not valid JSON"},
  };
  for (const auto& [text, needle] : cases) {
    auto recipe = ParseRecipe(text);
    ASSERT_FALSE(recipe.ok()) << text;
    EXPECT_EQ(recipe.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(recipe.status().message().find(needle), std::string::npos)
        << text << " -> " << recipe.status().message();
  }
}

// Verifies the Python lane's recipe: pip build, entries, and the fields of the other lane refused.
TEST(RecipeTest, PythonLane) {
  auto recipe = ParseRecipe(R"({"recipe_version":1,"lane":"python",
      "build":{"system":"pip","source_dir":"adapters/python"},
      "entries":["gh_archon.llama.spec:SPEC","pkg.mod:OTHER_SPEC"]})");
  ASSERT_TRUE(recipe.ok()) << recipe.status().ToString();
  EXPECT_EQ(recipe->lane, "python");
  EXPECT_EQ(recipe->build_system, "pip");
  EXPECT_EQ(recipe->source_dir, "adapters/python");
  EXPECT_EQ(recipe->entries,
            (std::vector<std::string>{"gh_archon.llama.spec:SPEC", "pkg.mod:OTHER_SPEC"}));
  EXPECT_TRUE(recipe->plugins.empty());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"recipe_version":1,"lane":"rust","build":{"system":"pip"},"entries":["a:B"]})", "lane"},
      {R"({"recipe_version":1,"lane":"python","build":{"system":"cmake"},"entries":["a:B"]})",
       "build.system"},
      {R"({"recipe_version":1,"lane":"python","build":{"system":"pip"}})", "entries"},
      {R"({"recipe_version":1,"lane":"python","build":{"system":"pip"},"entries":[]})", "entries"},
      {R"({"recipe_version":1,"lane":"python","build":{"system":"pip"},"entries":["a.b"]})",
       "entries[0]"},
      {R"({"recipe_version":1,"lane":"python","build":{"system":"pip"},"entries":["a:b.C"]})",
       "entries[0]"},
      {R"({"recipe_version":1,"lane":"python","build":{"system":"pip"},"entries":["1a:B"]})",
       "entries[0]"},
      {R"({"recipe_version":1,"lane":"python","build":{"system":"pip"},"entries":["a;rm:B"]})",
       "entries[0]"},
      {R"({"recipe_version":1,"lane":"python","build":{"system":"pip","target":"x"},"entries":["a:B"]})",
       "build.target"},
      {R"({"recipe_version":1,"lane":"python","build":{"system":"pip"},"entries":["a:B"],"plugins":["p.so"]})",
       "plugins"},
      {R"({"recipe_version":1,"build":{"system":"cmake"},"plugins":["p.so"],"entries":["a:B"]})",
       "entries"},
  };
  for (const auto& [text, needle] : cases) {
    auto bad = ParseRecipe(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.status().message().find("field '" + needle + "'"), std::string::npos)
        << text << " -> " << bad.status().message();
  }
}

// Verifies that a checkout without a recipe reports exactly which commit lacks it.
// Verifies "families": optional in both lanes, each a model_family name, refused empty or
// malformed naming the element; Serves and CheckServes answer for declared and undeclared ones.
TEST(RecipeTest, DeclaredFamilies) {
  const std::string base =
      R"({"recipe_version": 1, "build": {"system": "cmake"}, "plugins": ["libx.so"])";
  Result<Recipe> none = ParseRecipe(base + "}");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->families.empty());
  EXPECT_TRUE(none->Serves("anything"));
  EXPECT_TRUE(CheckServes(*none, "anything", "abc").ok());

  Result<Recipe> two = ParseRecipe(base + R"(, "families": ["olmo2", "llama"]})");
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->families, (std::vector<std::string>{"olmo2", "llama"}));
  EXPECT_TRUE(two->Serves("olmo2"));
  EXPECT_FALSE(two->Serves("olmo-2"));
  EXPECT_TRUE(CheckServes(*two, "llama", "abc").ok());
  const Status refused = CheckServes(*two, "olmo-2", "0123abc");
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(),
            "field 'model_family' = \"olmo-2\": the adapter at 0123abc declares the families "
            "\"olmo2\", \"llama\" (gatehouse.recipe.json)");

  Result<Recipe> python = ParseRecipe(
      R"({"recipe_version": 1, "lane": "python", "build": {"system": "pip"},
          "entries": ["pkg.spec:SPEC"], "families": ["olmo2"]})");
  ASSERT_TRUE(python.ok()) << python.status().ToString();
  EXPECT_EQ(python->families, std::vector<std::string>{"olmo2"});

  EXPECT_EQ(ParseRecipe(base + R"(, "families": []})").status().message(),
            "gatehouse.recipe.json: field 'families': must name at least one family when present");
  EXPECT_EQ(ParseRecipe(base + R"(, "families": ["ok", "../x"]})").status().message(),
            "gatehouse.recipe.json: field 'families[1]': must be a model_family name "
            "([A-Za-z0-9_.-]), got \"../x\"");
  EXPECT_EQ(ParseRecipe(base + R"(, "families": "llama"})").status().message(),
            "gatehouse.recipe.json: field 'families': must be an array of strings, got \"llama\"");
}

TEST(RecipeTest, MissingRecipeNamesTheCommit) {
  TempDir dir;
  auto recipe = LoadRecipe(dir.path(), "0123456789abcdef0123456789abcdef01234567");
  ASSERT_FALSE(recipe.ok());
  EXPECT_EQ(recipe.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(recipe.status().message(),
            "gatehouse.recipe.json not found at 0123456789abcdef0123456789abcdef01234567");
}

// Verifies that LoadRecipe reads the file and requires source_dir to exist inside the checkout,
// also when a checked-in symlink points elsewhere.
TEST(RecipeTest, LoadChecksSourceDirOnDisk) {
  TempDir outside;
  TempDir repo;
  std::filesystem::create_directories(repo.path() / "src");
  std::filesystem::create_directory_symlink(outside.path(), repo.path() / "escape");

  WriteFile(repo.path() / "gatehouse.recipe.json",
            R"({"recipe_version":1,"build":{"system":"cmake","source_dir":"src"},"plugins":["p.so"]})");
  auto ok = LoadRecipe(repo.path(), "abc");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->source_dir, "src");

  WriteFile(repo.path() / "gatehouse.recipe.json",
            R"({"recipe_version":1,"build":{"system":"cmake","source_dir":"missing"},"plugins":["p.so"]})");
  auto missing = LoadRecipe(repo.path(), "abc");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("names no directory"), std::string::npos)
      << missing.status().message();

  WriteFile(repo.path() / "gatehouse.recipe.json",
            R"({"recipe_version":1,"build":{"system":"cmake","source_dir":"escape"},"plugins":["p.so"]})");
  auto escape = LoadRecipe(repo.path(), "abc");
  ASSERT_FALSE(escape.ok());
  EXPECT_NE(escape.status().message().find("outside the repository"), std::string::npos)
      << escape.status().message();
}

}  // namespace
}  // namespace gatehouse::agent
