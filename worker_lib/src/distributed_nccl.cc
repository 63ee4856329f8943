// c10d NCCL process groups (distributed.h JoinNcclGroup). Compiled with USE_C10D_NCCL when
// LibTorch has CUDA and nccl.h was found (worker_lib/CMakeLists.txt); ProcessGroupNCCL.hpp is
// empty without that define, and JoinNcclGroup then says the worker was built without NCCL.
#include "gatehouse/worker/distributed.h"

#include "distributed_subgroups.h"
#include "gatehouse/worker/cuda_graph.h"

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace gatehouse::worker {

bool NcclGroupsAvailable() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

Result<JoinedGroup> JoinNcclGroup(const RankEnv& env, int device_index,
                                  std::chrono::milliseconds timeout) {
#ifdef USE_C10D_NCCL
  GH_RETURN_IF_ERROR(SetCudaDevice(device_index));
  GH_ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store, ConnectStore(env, timeout));
  try {
    auto make = [timeout](const c10::intrusive_ptr<c10d::Store>& s, int rank, int size) {
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      return c10::intrusive_ptr<c10d::Backend>(
          c10::make_intrusive<c10d::ProcessGroupNCCL>(s, rank, size, options));
    };
    JoinedGroup joined;
    joined.group = make(store, env.rank, env.world_size);
    joined.subgroups = internal::MakeStoreSubgroups(
        env.rank, store,
        torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_index)), make, "NCCL");
    return joined;
  } catch (const std::exception& e) {
    return Status::Unavailable("rank " + std::to_string(env.rank) + " of " +
                               std::to_string(env.world_size) + " could not join the NCCL group on cuda:" +
                               std::to_string(device_index) + ": " + e.what());
  }
#else
  (void)env;
  (void)device_index;
  (void)timeout;
  return Status::FailedPrecondition("this worker was built without c10d's NCCL backend (nccl.h not found at configure time)");
#endif
}

}  // namespace gatehouse::worker
