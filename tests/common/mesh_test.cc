#include "common/mesh.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace gatehouse {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Dim = Mesh::Dim;

Mesh MustMake(const MeshShape& s) {
  Result<Mesh> m = Mesh::Make(s, 64);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

TEST(MeshTest, RanksAreRowMajorWithTpFastest) {
  // pp=2 x dp_shard=2 x tp=2: rank = pp * 4 + dp_shard * 2 + tp (torchtitan's order).
  const Mesh m = MustMake({.pp = 2, .dp_shard = 2, .tp = 2});
  EXPECT_EQ(m.world_size(), 8);
  EXPECT_THAT(m.CoordinatesOf(5), ElementsAre(1, 0, 0, 0, 1));
  EXPECT_THAT(m.CoordinatesOf(6), ElementsAre(1, 0, 1, 0, 0));
  for (int64_t r = 0; r < m.world_size(); ++r) EXPECT_EQ(m.RankOf(m.CoordinatesOf(r)), r);
}

TEST(MeshTest, GroupsOfOneDimension) {
  const Mesh m = MustMake({.dp_replicate = 2, .tp = 2});
  EXPECT_THAT(m.GroupOf(3, {Dim::kTp}), ElementsAre(2, 3));
  EXPECT_THAT(m.GroupOf(3, {Dim::kDpReplicate}), ElementsAre(1, 3));
  EXPECT_THAT(m.GroupOf(3, {}), ElementsAre(3));
  EXPECT_THAT(m.GroupOf(1, {Dim::kPp}), ElementsAre(1));  // a dimension of size 1
  const auto tp_groups = m.GroupsAlong({Dim::kTp});
  ASSERT_EQ(tp_groups.size(), 2u);
  EXPECT_THAT(tp_groups[0], ElementsAre(0, 1));
  EXPECT_THAT(tp_groups[1], ElementsAre(2, 3));
}

TEST(MeshTest, FlattenedGroupsAreRowMajorOverTheirDims) {
  // dp_shard_cp as FSDP shards over it: dp_shard=2 x cp=2, with tp=2 outside the group.
  const Mesh m = MustMake({.dp_shard = 2, .cp = 2, .tp = 2});
  EXPECT_THAT(m.GroupOf(1, {Dim::kCp, Dim::kDpShard}), ElementsAre(1, 3, 5, 7));
  EXPECT_THAT(m.GroupOf(6, {Dim::kDpShard, Dim::kCp}), ElementsAre(0, 2, 4, 6));
}

TEST(MeshTest, GroupsAlongPartitionTheWorld) {
  const Mesh m = MustMake({.pp = 2, .dp_replicate = 2, .dp_shard = 2, .tp = 2});
  for (const std::vector<Dim>& dims :
       {std::vector<Dim>{Dim::kTp}, {Dim::kPp}, {Dim::kDpReplicate, Dim::kDpShard}, {}}) {
    std::set<int64_t> seen;
    size_t members = 0;
    for (const auto& g : m.GroupsAlong(dims)) {
      members += g.size();
      seen.insert(g.begin(), g.end());
      for (int64_t r : g) EXPECT_EQ(m.GroupOf(r, dims), g);  // the same group from each member
    }
    EXPECT_EQ(members, 16u);
    EXPECT_EQ(seen.size(), 16u);
  }
}

TEST(MeshTest, ExpertGroupsBorrowTheInnermostDataAndContextRanks) {
  // etp = tp: ep from dp_shard x cp. dp_shard=4, tp=2, ep=2: rank = dp_shard * 2 + tp; the
  // dp_shard run of rank 0 is {0, 2, 4, 6}; ep takes its innermost pairs.
  const Mesh a = MustMake({.dp_shard = 4, .tp = 2, .ep = 2, .etp = 2});
  EXPECT_THAT(a.ExpertGroupOf(0), ElementsAre(0, 2));
  EXPECT_THAT(a.ExpertGroupOf(4), ElementsAre(4, 6));
  EXPECT_THAT(a.ExpertGroupOf(7), ElementsAre(5, 7));
  EXPECT_EQ(a.ExpertGroups().size(), 4u);
  // etp = 1: ep from dp_shard x cp x tp, so the TP pair can share one EP group.
  const Mesh b = MustMake({.dp_shard = 2, .tp = 2, .ep = 2, .etp = 1});
  EXPECT_THAT(b.ExpertGroupOf(3), ElementsAre(2, 3));
  const Mesh c = MustMake({.dp_shard = 2, .tp = 2, .ep = 4, .etp = 1});
  EXPECT_THAT(c.ExpertGroupOf(2), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(MustMake({.tp = 2}).ExpertGroupOf(1), ElementsAre(1));
}

TEST(MeshTest, RefusesShapesNamingTheField) {
  const auto error = [](const MeshShape& s) {
    Result<Mesh> m = Mesh::Make(s, 64);
    EXPECT_FALSE(m.ok());
    return m.ok() ? std::string() : m.status().message();
  };
  EXPECT_THAT(error({.cp = 0}), HasSubstr("field 'topology.cp': expected a degree from 1 to 64, got 0"));
  EXPECT_THAT(error({.dp_shard = 16, .tp = 8}),
              HasSubstr("16 x 1 x 8 is more than 64 worker ranks"));
  EXPECT_THAT(error({.dp_shard = 3, .ep = 2}),
              HasSubstr("field 'topology.ep': 2 ranks must be borrowed from dp_shard x cp = 3"));
  EXPECT_THAT(error({.dp_shard = 4, .cp = 2, .ep = 3}), HasSubstr("topology.ep"));
  EXPECT_THAT(error({.dp_shard = 2, .tp = 2, .ep = 2, .etp = 3}),
              HasSubstr("field 'topology.etp': 3 must be 1"));
  EXPECT_THAT(error({.tp = 2, .etp = 2}), HasSubstr("without expert parallelism"));
  // etp = 1 borrows tp too: ep must be a multiple of cp x tp.
  EXPECT_THAT(error({.dp_shard = 2, .tp = 2, .ep = 3, .etp = 1}), HasSubstr("cp x tp (2)"));
  Result<Mesh> prefixed = Mesh::Make({.pp = 65}, 64, "mesh.");
  ASSERT_FALSE(prefixed.ok());
  EXPECT_THAT(prefixed.status().message(), HasSubstr("field 'mesh.pp'"));
}

TEST(MeshTest, NamesItsDimensions) {
  const Mesh m = MustMake({.dp_shard = 2, .tp = 2, .ep = 2, .etp = 1});
  EXPECT_EQ(m.ToString(), "pp=1 dp_replicate=1 dp_shard=2 cp=1 tp=2 ep=2 etp=1");
  EXPECT_THAT(m.EnabledNames(), ElementsAre("dp_shard", "tp", "ep"));
  EXPECT_EQ(MustMake({}).ToString(), "pp=1 dp_replicate=1 dp_shard=1 cp=1 tp=1 ep=1");
  EXPECT_TRUE(MustMake({}).EnabledNames().empty());
}

}  // namespace
}  // namespace gatehouse
