// models/decoder/config_reader: typed reads of config.json fields, errors that name the field
// and value, and the accounting of every top-level field as mapped, ignored or unmapped.

#include "decoder/config_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace gatehouse::models {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(ConfigReader, TypedReadsAndAbsentOrNullAsNotGiven) {
  const json config = {{"hidden_size", 32},  {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", true},
                       {"hidden_act", "silu"}, {"sliding_window", nullptr}, {"rope_theta", 10000}};
  ConfigReader reader(config);
  ASSERT_TRUE(reader.Check().ok());
  EXPECT_EQ(*reader.RequiredInt("hidden_size"), 32);
  EXPECT_EQ(*reader.RequiredNumber("rms_norm_eps"), 1e-5);
  EXPECT_EQ(*reader.RequiredNumber("rope_theta"), 10000.0);  // an integer is a number
  EXPECT_TRUE(*reader.Bool("tie_word_embeddings", false));
  EXPECT_EQ(reader.OptionalString("hidden_act")->value(), "silu");
  EXPECT_FALSE(reader.OptionalInt("sliding_window")->has_value());
  EXPECT_FALSE(reader.OptionalInt("num_key_value_heads")->has_value());
  EXPECT_TRUE(*reader.Bool("attention_bias", true));
  EXPECT_EQ(reader.Raw("absent"), nullptr);
}

TEST(ConfigReader, ErrorsNameTheFieldAndTheValue) {
  const json config = {{"hidden_size", 32.5}, {"rms_norm_eps", "1e-5"}, {"tie_word_embeddings", 1},
                       {"hidden_act", 7},     {"head_dim", nullptr}};
  ConfigReader reader(config);
  EXPECT_EQ(reader.RequiredInt("hidden_size").status().message(),
            "config field 'hidden_size' = 32.5: expected an integer");
  EXPECT_EQ(reader.RequiredNumber("rms_norm_eps").status().message(),
            "config field 'rms_norm_eps' = \"1e-5\": expected a number");
  EXPECT_EQ(reader.Bool("tie_word_embeddings", false).status().message(),
            "config field 'tie_word_embeddings' = 1: expected true or false");
  EXPECT_EQ(reader.OptionalString("hidden_act").status().message(),
            "config field 'hidden_act' = 7: expected a string");
  // null is "not given": a required field that is null is missing, not mistyped.
  EXPECT_EQ(reader.RequiredInt("head_dim").status().message(),
            "config field 'head_dim' is required but missing");
  EXPECT_EQ(reader.RequiredInt("vocab_size").status().message(),
            "config field 'vocab_size' is required but missing");
}

TEST(ConfigReader, NotAnObjectIsRefusedWithItsType) {
  const json config = json::array({1, 2});
  ConfigReader reader(config);
  EXPECT_EQ(reader.Check().message(), "config.json must be a JSON object, got array");
  EXPECT_TRUE(reader.Report().mapped.empty());
}

TEST(ConfigReader, StringInListsWhatTheFamilyImplements) {
  const json config = {{"hidden_act", "relu"}};
  ConfigReader reader(config);
  auto act = reader.StringIn("hidden_act", "silu", {"silu", "gelu_pytorch_tanh"}, "gemma");
  ASSERT_FALSE(act.ok());
  EXPECT_EQ(act.status().message(),
            "config field 'hidden_act' = \"relu\": unsupported value (the gemma family "
            "implements \"silu\", \"gelu_pytorch_tanh\")");
  const json absent = json::object();
  ConfigReader fallback(absent);
  EXPECT_EQ(*fallback.StringIn("hidden_act", "silu", {"silu"}, "llama"), "silu");
}

TEST(ConfigReader, ModelTypeMustBeOneTheFamilyServesOrAbsent) {
  const json other = {{"model_type", "gpt2"}};
  ConfigReader reader(other);
  EXPECT_EQ(reader.ExpectModelType({"llama"}, "llama").message(),
            "config field 'model_type' = \"gpt2\": the llama family serves \"llama\"");
  const json absent = json::object();
  ConfigReader none(absent);
  EXPECT_TRUE(none.ExpectModelType({"llama"}, "llama").ok());
}

TEST(ConfigReader, ReportAccountsForEveryTopLevelFieldInConfigOrder) {
  const json config = json::parse(R"({"vocab_size": 64, "transformers_version": "5.0",
      "use_cache": true, "my_custom_scale": 2.0, "num_key_value_heads": null,
      "attention_dropout": 0.0})");
  ConfigReader reader(config);
  reader.IgnoreCommonFields();
  ASSERT_TRUE(reader.RequiredInt("vocab_size").ok());
  ASSERT_TRUE(reader.OptionalInt("num_key_value_heads").ok());
  reader.Ignore("never_present", "a declared field the config does not hold is not reported");
  reader.AddUnmapped("rope_parameters.beta_fast");
  const auto report = reader.Report();
  // nlohmann::json orders object members by key.
  EXPECT_THAT(report.mapped, ElementsAre("num_key_value_heads", "vocab_size"));
  ASSERT_EQ(report.ignored.size(), 3u);
  EXPECT_EQ(report.ignored[0].first, "attention_dropout");
  EXPECT_EQ(report.ignored[1].first, "transformers_version");
  EXPECT_EQ(report.ignored[2].first, "use_cache");
  for (const auto& [field, reason] : report.ignored) EXPECT_FALSE(reason.empty()) << field;
  EXPECT_THAT(report.unmapped, ElementsAre("my_custom_scale", "rope_parameters.beta_fast"));
}

TEST(ConfigReader, ReadingAFieldMarksItMappedEvenWhenTheReadFails) {
  // A mistyped field fails the parse; it is still "read", so it is never also listed unmapped.
  const json config = {{"hidden_size", "32"}};
  ConfigReader reader(config);
  EXPECT_FALSE(reader.RequiredInt("hidden_size").ok());
  EXPECT_THAT(reader.Report().mapped, ElementsAre("hidden_size"));
  EXPECT_TRUE(reader.Report().unmapped.empty());
}

TEST(ConfigReader, UnreadFlagFalseIsIgnoredTrueIsRefused) {
  const json off = {{"use_sliding_window", false}};
  ConfigReader reader_off(off);
  ASSERT_TRUE(reader_off
                  .IgnoreUnreadFlag("use_sliding_window", "modeling_x.py never reads it",
                                    "a sliding window upstream does not apply")
                  .ok());
  EXPECT_THAT(reader_off.Report().ignored,
              ElementsAre(Pair("use_sliding_window", "false: modeling_x.py never reads it")));

  const json on = {{"use_sliding_window", true}};
  ConfigReader reader_on(on);
  EXPECT_EQ(reader_on
                .IgnoreUnreadFlag("use_sliding_window", "modeling_x.py never reads it",
                                  "a sliding window upstream does not apply")
                .message(),
            "config field 'use_sliding_window' = true: a sliding window upstream does not "
            "apply (modeling_x.py never reads it)");

  const json wrong = {{"use_sliding_window", "yes"}};
  ConfigReader reader_wrong(wrong);
  EXPECT_THAT(reader_wrong.IgnoreUnreadFlag("use_sliding_window", "unread", "applies").message(),
              HasSubstr("expected true or false"));
}

TEST(ConfigReader, NestedReadsNameTheDottedKey) {
  const json dict = {{"factor", "8"}, {"original_max_position_embeddings", 8192.5},
                     {"rope_type", 3}, {"low_freq_factor", nullptr}};
  EXPECT_EQ(NestedNumber(dict, "rope_parameters.", "factor").status().message(),
            "config field 'rope_parameters.factor' = \"8\": expected a number");
  EXPECT_EQ(
      NestedInt(dict, "rope_parameters.", "original_max_position_embeddings").status().message(),
      "config field 'rope_parameters.original_max_position_embeddings' = 8192.5: expected an "
      "integer");
  EXPECT_EQ(NestedString(dict, "rope_scaling.", "rope_type").status().message(),
            "config field 'rope_scaling.rope_type' = 3: expected a string");
  EXPECT_FALSE(NestedNumber(dict, "rope_parameters.", "low_freq_factor")->has_value());
  EXPECT_FALSE(NestedNumber(dict, "rope_parameters.", "absent")->has_value());
}

TEST(ConfigReader, InvalidUtf8InAValueStillGivesAReadableError) {
  const json config = {{"hidden_act", std::string("si\xff" "lu")}};
  ConfigReader reader(config);
  auto act = reader.StringIn("hidden_act", "silu", {"silu"}, "llama");
  ASSERT_FALSE(act.ok());
  EXPECT_THAT(act.status().message(), HasSubstr("config field 'hidden_act' = \"si"));
}

}  // namespace
}  // namespace gatehouse::models
