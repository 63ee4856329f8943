// Process groups for tensor parallelism (issue 4): one worker process per rank, found the
// torchrun way, joined through LibTorch's c10d. Collectives are c10d's (gloo on the CPU, NCCL
// on GPUs), never our own.
//
// Build note: LibTorch's wheel ships c10d's headers but not gloo's, which ProcessGroupGloo.hpp
// includes; the declarations come from Debian's libgloo-dev (deploy/setup.sh installs it) and
// every gloo symbol from the wheel's libtorch_cpu, into which torch links its own gloo. Only
// distributed.cc includes ProcessGroupGloo.hpp, and it holds gloo objects only by pointer.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "gatehouse/worker/tensor_parallel.h"

namespace gatehouse::worker {

/// Where this process sits in its group (torchrun's environment variables).
struct RankEnv {
  int rank = 0;        // RANK, 0 .. world_size - 1
  int world_size = 1;  // WORLD_SIZE
  int local_rank = 0;  // LOCAL_RANK (this node's index; the device index on a GPU node)
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR: where rank 0 hosts the store
  int master_port = 0;                    // MASTER_PORT
};

/// Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT through `getenv`. Without
/// WORLD_SIZE the process is alone (rank 0 of 1). Errors: INVALID_ARGUMENT naming the variable
/// and its value: not an integer, WORLD_SIZE < 1, RANK outside [0, WORLD_SIZE), a port outside
/// [1, 65535], or MASTER_ADDR / MASTER_PORT missing when WORLD_SIZE > 1.
Result<RankEnv> ReadRankEnv(
    const std::function<const char*(const char*)>& getenv = [](const char* name) {
      return std::getenv(name);
    });

/// The group's rendezvous: rank 0 binds a listening socket to master_addr:master_port and
/// hosts a c10d::TCPStore on it; every rank connects to it. master_addr is an IPv4 literal or a
/// host name (Slurm's first node, resolved); a loopback one (one host) is bound on that address
/// only, any other on every address (torchrun's way across nodes). Errors: INVALID_ARGUMENT
/// (master_addr neither an IPv4 address nor resolving to one), UNAVAILABLE naming the address
/// and the cause.
Result<c10::intrusive_ptr<c10d::Store>> ConnectStore(const RankEnv& env,
                                                    std::chrono::milliseconds timeout);

/// A joined world group and the means to form groups over subsets of its ranks.
struct JoinedGroup {
  c10::intrusive_ptr<c10d::Backend> group;    // every rank of the world
  std::shared_ptr<SubgroupFactory> subgroups;  // the same backend, over the same rendezvous
};

/// Joins the group of `env.world_size` ranks: the rendezvous of ConnectStore, then a c10d
/// ProcessGroupGloo whose transport binds to a loopback master_addr (one host), or across
/// nodes to each rank's own host address (gloo's default device). Its sub-groups are gloo
/// groups of their own on the same store, each under the prefix "gatehouse/<name>/<ranks>".
/// Blocks until all ranks joined or `timeout` passed. Errors: INVALID_ARGUMENT (bad
/// master_addr), UNAVAILABLE naming the address and the cause (cannot bind, a rank missing at
/// the timeout, gloo failures).
Result<JoinedGroup> JoinGlooGroup(const RankEnv& env, std::chrono::milliseconds timeout);

/// True when this worker was built with c10d's NCCL backend (USE_C10D_NCCL: LibTorch with CUDA
/// and nccl.h found at configure time; worker_lib/CMakeLists.txt).
bool NcclGroupsAvailable();

/// Joins the NCCL group of `env.world_size` ranks over the same rendezvous as JoinGlooGroup
/// (ConnectStore), bound to CUDA device `device_index` (made current first; the agent makes one
/// GPU per rank visible and the rank uses device LOCAL_RANK). NCCL creates its communicator
/// lazily, at the first collective. Errors: FAILED_PRECONDITION when !NcclGroupsAvailable(),
/// FAILED_PRECONDITION without CUDA or when the device is not visible; UNAVAILABLE as
/// JoinGlooGroup; sub-groups are NCCL groups on the same device and store. Checked here only
/// by compiling: NCCL needs one GPU per rank.
Result<JoinedGroup> JoinNcclGroup(const RankEnv& env, int device_index,
                                  std::chrono::milliseconds timeout);

/// The collectives of `group` as tensor-parallel modules use them (tensor_parallel.h):
/// AllReduceSum is c10d allreduce (SUM), AllGather is c10d allgather; both wait for the work
/// and throw c10::Error when the group fails. `device` is the group's device (CPU for gloo,
/// the rank's GPU for NCCL): a tensor elsewhere is copied there for the collective and the
/// results come back on the tensor's own device, so gates may pass small CPU tensors.
std::shared_ptr<TpCommunicator> MakeC10dCommunicator(c10::intrusive_ptr<c10d::Backend> group,
                                                     torch::Device device = torch::kCPU);

}  // namespace gatehouse::worker
