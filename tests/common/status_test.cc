// Verifies Status/Result carry codes, messages and values, and the macros propagate errors.
#include "common/status.h"

#include <gtest/gtest.h>

namespace gatehouse {
namespace {

Result<int> ParsePositive(int v) {
  if (v <= 0) return Status::InvalidArgument("field 'tp': must be positive, got " + std::to_string(v));
  return v;
}

Result<int> Doubled(int v) {
  GH_ASSIGN_OR_RETURN(int x, ParsePositive(v));
  return 2 * x;
}

TEST(StatusTest, OkAndErrorCarryCodeAndMessage) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = Status::NotFound("cell 'abc'");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: cell 'abc'");
  EXPECT_EQ(s.WithContext("GET").message(), "GET: cell 'abc'");
}

TEST(StatusTest, AssignOrReturnPropagatesTheError) {
  EXPECT_EQ(*Doubled(3), 6);
  Result<int> r = Doubled(-1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("-1"), std::string::npos);
}

}  // namespace
}  // namespace gatehouse
