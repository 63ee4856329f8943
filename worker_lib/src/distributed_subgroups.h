// Sub-groups of a joined world group (distributed.h JoinedGroup): each a c10d backend of its
// own, rendezvousing on the world's store under a prefix that names the group, so groups of
// the same ranks for different purposes never share keys. Internal to the SDK: gloo's and
// NCCL's factories (distributed.cc, distributed_nccl.cc) differ only in how a backend is made.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <memory>
#include <string>

#include "gatehouse/worker/tensor_parallel.h"

namespace gatehouse::worker::internal {

/// Makes one backend of `size` ranks, this one being `rank`, rendezvousing on `store`.
/// May throw (c10::Error, std::exception): the factory turns that into UNAVAILABLE.
using MakeBackend = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)>;

/// A SubgroupFactory for world rank `world_rank`: Join makes a backend with `make` on a
/// c10d::PrefixStore "gatehouse/<name>/<r0,r1,...>" of `store` and wraps it with
/// MakeC10dCommunicator on `device`. `backend_name` ("gloo", "NCCL") names it in errors.
std::shared_ptr<SubgroupFactory> MakeStoreSubgroups(int64_t world_rank,
                                                    c10::intrusive_ptr<c10d::Store> store,
                                                    torch::Device device, MakeBackend make,
                                                    std::string backend_name);

}  // namespace gatehouse::worker::internal
