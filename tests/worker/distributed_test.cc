// ReadRankEnv (torchrun variables) and JoinGlooGroup: c10d gloo groups of 2 and 4 ranks and
// the sub-groups of a mesh's dimensions, here one thread per rank in one process, on 127.0.0.1.
#include "gatehouse/worker/distributed.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/mesh.h"
#include "tests/worker/gloo_ranks.h"

namespace gatehouse::worker {
namespace {

using ::testing::HasSubstr;

/// getenv over a fixed map.
auto Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

// Verifies a process without WORLD_SIZE is rank 0 of 1, and a full torchrun set is read.
TEST(RankEnvTest, ReadsTorchrunVariables) {
  auto alone = ReadRankEnv(Env({}));
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  EXPECT_EQ(alone->rank, 0);
  EXPECT_EQ(alone->world_size, 1);

  auto r = ReadRankEnv(Env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                            {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29555"}}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->master_addr, "127.0.0.1");
  EXPECT_EQ(r->master_port, 29555);
}

// Verifies each bad value is INVALID_ARGUMENT naming the variable and the value.
TEST(RankEnvTest, BadValuesNameTheVariable) {
  const std::map<std::string, std::string> ok = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29555"}};
  auto with = [&](const std::string& k, const std::string& v) {
    auto vars = ok;
    vars[k] = v;
    return ReadRankEnv(Env(vars));
  };
  auto without = [&](const std::string& k) {
    auto vars = ok;
    vars.erase(k);
    return ReadRankEnv(Env(vars));
  };
  EXPECT_THAT(with("WORLD_SIZE", "two").status().message(), HasSubstr("WORLD_SIZE='two'"));
  EXPECT_THAT(with("WORLD_SIZE", "0").status().message(), HasSubstr("WORLD_SIZE=0"));
  EXPECT_THAT(with("RANK", "2").status().message(), HasSubstr("RANK=2 is outside [0, WORLD_SIZE=2)"));
  EXPECT_THAT(with("RANK", "-1").status().message(), HasSubstr("RANK=-1"));
  EXPECT_THAT(with("MASTER_PORT", "70000").status().message(), HasSubstr("MASTER_PORT=70000"));
  EXPECT_THAT(without("MASTER_ADDR").status().message(), HasSubstr("MASTER_ADDR is required"));
  EXPECT_THAT(without("MASTER_PORT").status().message(), HasSubstr("MASTER_PORT is required"));
  EXPECT_EQ(with("RANK", "2").status().code(), StatusCode::kInvalidArgument);
}

using test_util::FreePort;

/// Runs `world` ranks (one thread each) through JoinGlooGroup, then allreduce (sum) of
/// [rank + 1, 10 * (rank + 1)] and allgather of [rank]; returns per rank the reduced tensor
/// and the gathered ranks, or fails the test with the rank's error.
void ExpectCollectives(int world, const std::string& master_addr = "127.0.0.1") {
  const int port = FreePort();
  std::vector<torch::Tensor> reduced(world), gathered(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankEnv env;
      env.rank = r;
      env.world_size = world;
      env.master_addr = master_addr;
      env.master_port = port;
      auto group = JoinGlooGroup(env, std::chrono::seconds(30));
      if (!group.ok()) {
        errors[r] = group.status().ToString();
        return;
      }
      std::vector<at::Tensor> t{torch::tensor({1.0f * (r + 1), 10.0f * (r + 1)})};
      group->group->allreduce(t)->wait();
      reduced[r] = t[0];
      std::vector<std::vector<at::Tensor>> out(1);
      for (int i = 0; i < world; ++i) out[0].push_back(torch::empty({1}, torch::kLong));
      std::vector<at::Tensor> in{torch::tensor({static_cast<int64_t>(r)})};
      group->group->allgather(out, in)->wait();
      gathered[r] = torch::cat(out[0]);
    });
  }
  for (auto& t : threads) t.join();
  const float sum = world * (world + 1) / 2.0f;
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(torch::equal(reduced[r], torch::tensor({sum, 10 * sum}))) << reduced[r];
    EXPECT_TRUE(torch::equal(gathered[r], torch::arange(world, torch::kLong))) << gathered[r];
  }
}

// Verifies a gloo group of 2 ranks joins on 127.0.0.1 and its collectives are exact.
TEST(GlooGroupTest, TwoRanks) { ExpectCollectives(2); }

// Verifies the same with 4 ranks (the TP=4 case of issue 4).
TEST(GlooGroupTest, FourRanks) { ExpectCollectives(4); }

// Verifies a master given by host name (Slurm's first node, docs/protocols.md §3.5) is
// resolved: "localhost" is loopback, so the group stays on this host.
TEST(GlooGroupTest, HostNameMaster) { ExpectCollectives(2, "localhost"); }

// Verifies a rank whose peers never come fails with UNAVAILABLE at the timeout, naming the
// address, instead of hanging.
TEST(GlooGroupTest, MissingPeerTimesOut) {
  RankEnv env;
  env.rank = 0;
  env.world_size = 2;
  env.master_port = FreePort();
  auto group = JoinGlooGroup(env, std::chrono::milliseconds(1500));
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(group.status().message(), HasSubstr("127.0.0.1:" + std::to_string(env.master_port)));
}

// Verifies a master address that is neither IPv4 nor a name that resolves is INVALID_ARGUMENT
// naming it.
TEST(GlooGroupTest, BadMasterAddress) {
  RankEnv env;
  env.world_size = 2;
  env.master_addr = "not-an-address.invalid";
  env.master_port = FreePort();
  auto group = JoinGlooGroup(env, std::chrono::milliseconds(500));
  EXPECT_EQ(group.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(group.status().message(), HasSubstr("not-an-address"));
}

// Verifies sub-groups along each dimension of a dp=2 x tp=2 mesh: each rank joins its TP group
// and its DP group (Mesh::GroupOf), and a sum over each adds exactly its members' values
// (ranks 0+1 and 2+3 along tp, 0+2 and 1+3 along dp), with the rank in the group being the
// index in the mesh's group.
TEST(GlooGroupTest, SubgroupsAlongMeshDimensions) {
  MeshShape shape;
  shape.dp_replicate = 2;
  shape.tp = 2;
  const Mesh mesh = *Mesh::Make(shape, 64);
  std::vector<torch::Tensor> tp_sum(4), dp_sum(4);
  std::vector<int64_t> tp_rank(4, -1), dp_size(4, -1);
  const std::vector<std::string> errors = test_util::RunGlooGroups(
      4, [&](int r, std::shared_ptr<TpCommunicator>, std::shared_ptr<SubgroupFactory> groups) {
        auto tp = groups->Join("tp", mesh.GroupOf(r, {Mesh::Dim::kTp}));
        auto dp = groups->Join("dp_replicate", mesh.GroupOf(r, {Mesh::Dim::kDpReplicate}));
        ASSERT_TRUE(tp.ok()) << tp.status().ToString();
        ASSERT_TRUE(dp.ok()) << dp.status().ToString();
        torch::Tensor a = torch::tensor({static_cast<double>(r)});
        torch::Tensor b = a.clone();
        (*tp)->AllReduceSum(a);
        (*dp)->AllReduceSum(b);
        tp_sum[r] = a;
        dp_sum[r] = b;
        tp_rank[r] = (*tp)->rank();
        dp_size[r] = (*dp)->world_size();
      });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(tp_sum[r].item<double>(), r < 2 ? 1.0 : 5.0) << "rank " << r;
    EXPECT_EQ(dp_sum[r].item<double>(), r % 2 == 0 ? 2.0 : 4.0) << "rank " << r;
    EXPECT_EQ(tp_rank[r], r % 2);
    EXPECT_EQ(dp_size[r], 2);
  }
}

// Verifies all-to-all over a real gloo group (c10d alltoall_base) and through the base class's
// all-gather (the default a communicator without alltoall gets): rank r sends r + d + 1 rows
// of value 10 r + d to rank d (uneven counts, none empty), each rank receiving its rows in
// source order; and AllToAllRows's backward sends the gradient rows back to their sources.
TEST(GlooGroupTest, AllToAllSendsRowsByCount) {
  /// The base class's AllToAll over a real group: what a test communicator gets.
  class ByAllGather : public TpCommunicator {
   public:
    explicit ByAllGather(std::shared_ptr<TpCommunicator> inner) : inner_(std::move(inner)) {}
    int64_t rank() const override { return inner_->rank(); }
    int64_t world_size() const override { return inner_->world_size(); }
    void AllReduceSum(torch::Tensor& t) override { inner_->AllReduceSum(t); }
    std::vector<torch::Tensor> AllGather(const torch::Tensor& t) override { return inner_->AllGather(t); }

   private:
    std::shared_ptr<TpCommunicator> inner_;
  };
  constexpr int kWorld = 3;
  std::vector<std::vector<torch::Tensor>> got(kWorld), got_default(kWorld);
  std::vector<torch::Tensor> grads(kWorld);
  const std::vector<std::string> errors = test_util::RunGlooGroups(
      kWorld, [&](int r, std::shared_ptr<TpCommunicator> comm, std::shared_ptr<SubgroupFactory>) {
        std::vector<torch::Tensor> send;
        std::vector<int64_t> send_rows, recv_rows;
        for (int d = 0; d < kWorld; ++d) {
          send.push_back(torch::full({r + d + 1, 2}, 10.0 * r + d));
          send_rows.push_back(r + d + 1);
          recv_rows.push_back(d + r + 1);  // rank d sends d + r + 1 rows here
        }
        got[r] = comm->AllToAll(send);
        got_default[r] = ByAllGather(comm).AllToAll(send);
        torch::Tensor x = torch::cat(send, 0).requires_grad_(true);
        ExpertParallel ep{r, kWorld, comm};
        torch::Tensor y = AllToAllRows(x, send_rows, recv_rows, ep);
        // d(sum(y * source)) / dx: each row's gradient is the rank it went to.
        torch::Tensor weight = torch::cat([&] {
          std::vector<torch::Tensor> w;
          for (int s = 0; s < kWorld; ++s) w.push_back(torch::full({s + r + 1, 2}, 1.0 * r));
          return w;
        }());
        (y * weight).sum().backward();
        grads[r] = x.grad();
      });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    for (const auto* parts : {&got[r], &got_default[r]}) {
      ASSERT_EQ(parts->size(), static_cast<size_t>(kWorld));
      for (int s = 0; s < kWorld; ++s) {
        EXPECT_TRUE(torch::equal((*parts)[s], torch::full({s + r + 1, 2}, 10.0 * s + r)))
            << "rank " << r << " from " << s;
      }
    }
    int64_t row = 0;
    for (int d = 0; d < kWorld; ++d) {
      EXPECT_TRUE(torch::equal(grads[r].slice(0, row, row + r + d + 1),
                               torch::full({r + d + 1, 2}, 1.0 * d)))
          << "rank " << r << " rows sent to " << d;
      row += r + d + 1;
    }
  }
}

// Verifies Ulysses' exchanges over a real group of 2: SequenceToHeads gives each rank every
// column of its half of the heads (the columns in rank order), HeadsToSequence undoes it, and
// the backward of SequenceToHeads routes each gradient element back to the rank and place it
// came from.
TEST(GlooGroupTest, SequenceToHeadsAndBack) {
  constexpr int kWorld = 2;
  // The whole tensor [B=1, T=6, H=4, D=3]: element value = 1000 t + 10 h + d.
  const torch::Tensor whole = [] {
    auto t = torch::arange(6).view({1, 6, 1, 1}), h = torch::arange(4).view({1, 1, 4, 1});
    return (1000 * t + 10 * h + torch::arange(3).view({1, 1, 1, 3})).to(torch::kFloat);
  }();
  std::vector<torch::Tensor> heads(kWorld), back(kWorld), grads(kWorld);
  const std::vector<std::string> errors = test_util::RunGlooGroups(
      kWorld, [&](int r, std::shared_ptr<TpCommunicator> comm, std::shared_ptr<SubgroupFactory>) {
        const ContextParallel cp{r, kWorld, comm};
        torch::Tensor x = whole.slice(1, 3 * r, 3 * r + 3).clone().requires_grad_(true);
        torch::Tensor y = SequenceToHeads(x, cp);
        heads[r] = y.detach();
        back[r] = HeadsToSequence(y.detach(), cp);
        (y * (r + 1)).sum().backward();  // rank r's heads weigh r + 1
        grads[r] = x.grad();
      });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(torch::equal(heads[r], whole.slice(2, 2 * r, 2 * r + 2))) << "rank " << r;
    EXPECT_TRUE(torch::equal(back[r], whole.slice(1, 3 * r, 3 * r + 3))) << "rank " << r;
    // Heads 0-1 went to rank 0 (weight 1), heads 2-3 to rank 1 (weight 2).
    torch::Tensor want = torch::ones({1, 3, 4, 3});
    want.slice(2, 2, 4).fill_(2);
    EXPECT_TRUE(torch::equal(grads[r], want)) << "rank " << r;
  }
}

// Verifies a sub-group that does not hold the joining rank is INVALID_ARGUMENT naming the
// group and its ranks, before any rendezvous.
TEST(GlooGroupTest, SubgroupWithoutThisRankIsRefused) {
  std::string message;
  StatusCode code = StatusCode::kOk;
  const std::vector<std::string> errors = test_util::RunGlooGroups(
      2, [&](int r, std::shared_ptr<TpCommunicator>, std::shared_ptr<SubgroupFactory> groups) {
        if (r != 0) return;
        auto g = groups->Join("tp", {1});
        code = g.status().code();
        message = g.status().message();
      });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(code, StatusCode::kInvalidArgument);
  EXPECT_THAT(message, HasSubstr("gloo group 'tp' of ranks [1]"));
}

}  // namespace
}  // namespace gatehouse::worker
