// Rank environment, the rendezvous store and c10d gloo process groups (distributed.h); NCCL
// groups are in distributed_nccl.cc.
#include "gatehouse/worker/distributed.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <numeric>
#include <optional>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "distributed_subgroups.h"

namespace gatehouse::worker {
namespace {

Result<std::optional<int>> IntVar(const std::function<const char*(const char*)>& getenv,
                                  const char* name) {
  const char* raw = getenv(name);
  if (raw == nullptr) return std::optional<int>();
  const std::string s(raw);
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
    return Status::InvalidArgument("environment variable " + std::string(name) + "='" + s +
                                   "' is not an integer");
  }
  return std::optional<int>(v);
}

/// MASTER_ADDR as an IPv4 address: a literal as is, a host name (Slurm's first node) through
/// the resolver. Errors: INVALID_ARGUMENT naming the value when it does not resolve.
Result<in_addr> ResolveMaster(const std::string& addr) {
  in_addr out{};
  if (inet_pton(AF_INET, addr.c_str(), &out) == 1) return out;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(addr.c_str(), nullptr, &hints, &found); rc != 0) {
    return Status::InvalidArgument("MASTER_ADDR='" + addr + "' is not an IPv4 address and does "
                                   "not resolve to one: " + ::gai_strerror(rc));
  }
  out = reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr;
  ::freeaddrinfo(found);
  return out;
}

/// True for 127.0.0.0/8: every rank is on this host.
bool IsLoopback(in_addr a) { return (ntohl(a.s_addr) >> 24) == 127; }

/// A TCP socket listening on `bind_to`:port, for the TCPStore server to take over.
Result<int> ListenOn(in_addr bind_to, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr = bind_to;
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &bind_to, text, sizeof(text));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(std::string("socket(): ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(fd, 128) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status::Unavailable("cannot listen on " + std::string(text) + ":" +
                               std::to_string(port) + ": " + why);
  }
  return fd;
}

class C10dCommunicator : public TpCommunicator {
 public:
  C10dCommunicator(c10::intrusive_ptr<c10d::Backend> group, torch::Device device)
      : group_(std::move(group)), device_(device) {}
  int64_t rank() const override { return group_->getRank(); }
  int64_t world_size() const override { return group_->getSize(); }
  void AllReduceSum(torch::Tensor& t) override {
    torch::Tensor on_device = t.to(device_).contiguous();
    std::vector<torch::Tensor> io{on_device};
    group_->allreduce(io)->wait();
    if (!io[0].is_same(t)) t.copy_(io[0]);
  }
  std::vector<torch::Tensor> AllGather(const torch::Tensor& t) override {
    std::vector<torch::Tensor> in{t.to(device_).contiguous()};
    std::vector<std::vector<torch::Tensor>> out(1);
    for (int64_t r = 0; r < world_size(); ++r) out[0].push_back(torch::empty_like(in[0]));
    group_->allgather(out, in)->wait();
    if (t.device() != device_) {
      for (torch::Tensor& x : out[0]) x = x.to(t.device());
    }
    return out[0];
  }
  std::function<void()> Send(const torch::Tensor& t, int64_t dst, int64_t tag) override {
    std::vector<torch::Tensor> io{t.detach().to(device_).contiguous()};
    c10::intrusive_ptr<c10d::Work> work =
        group_->send(io, static_cast<int>(dst), static_cast<int>(tag));
    // The tensor sent stays alive in the wait until the send is done.
    return [work, io]() { work->wait(); };
  }
  void Recv(torch::Tensor& t, int64_t src, int64_t tag) override {
    std::vector<torch::Tensor> io{t.device() == device_ && t.is_contiguous()
                                      ? t
                                      : torch::empty(t.sizes(), t.options().device(device_))};
    group_->recv(io, static_cast<int>(src), static_cast<int>(tag))->wait();
    if (!io[0].is_same(t)) t.copy_(io[0]);
  }
  /// One alltoall_base over the rows: the receive counts first (an all-gather of every rank's
  /// send counts), then the rows, split by count along dim 0.
  std::vector<torch::Tensor> AllToAll(const std::vector<torch::Tensor>& send) override {
    const int64_t size = world_size();
    TORCH_CHECK(static_cast<int64_t>(send.size()) == size, "all-to-all: ", send.size(),
                " tensors to send over a group of ", size);
    torch::Tensor counts = torch::empty({size}, torch::kLong);
    std::vector<int64_t> send_rows, recv_rows;
    for (int64_t r = 0; r < size; ++r) {
      send_rows.push_back(send[static_cast<size_t>(r)].size(0));
      counts[r] = send_rows.back();
    }
    for (const torch::Tensor& c : AllGather(counts)) recv_rows.push_back(c[rank()].item<int64_t>());
    const torch::Device home = send.front().device();
    torch::Tensor in = torch::cat(send, 0).to(device_).contiguous();
    std::vector<int64_t> shape = in.sizes().vec();
    shape[0] = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
    torch::Tensor out = torch::empty(shape, in.options());
    // alltoall_base takes the split sizes by reference and may move from them (gloo does).
    std::vector<int64_t> out_splits = recv_rows, in_splits = send_rows;
    group_->alltoall_base(out, in, out_splits, in_splits)->wait();
    std::vector<torch::Tensor> received;
    int64_t start = 0;
    for (int64_t n : recv_rows) {
      received.push_back(out.slice(0, start, start + n).to(home));
      start += n;
    }
    return received;
  }

 private:
  c10::intrusive_ptr<c10d::Backend> group_;
  torch::Device device_;
};

class StoreSubgroups : public SubgroupFactory {
 public:
  StoreSubgroups(int64_t world_rank, c10::intrusive_ptr<c10d::Store> store, torch::Device device,
                 internal::MakeBackend make, std::string backend_name)
      : world_rank_(world_rank),
        store_(std::move(store)),
        device_(device),
        make_(std::move(make)),
        backend_name_(std::move(backend_name)) {}

  Result<std::shared_ptr<TpCommunicator>> Join(const std::string& name,
                                               const std::vector<int64_t>& ranks) override {
    std::string list;
    for (int64_t r : ranks) list += (list.empty() ? "" : ",") + std::to_string(r);
    const std::string what = backend_name_ + " group '" + name + "' of ranks [" + list + "]";
    const auto self = std::find(ranks.begin(), ranks.end(), world_rank_);
    if (ranks.empty() || !std::is_sorted(ranks.begin(), ranks.end()) || self == ranks.end()) {
      return Status::InvalidArgument("rank " + std::to_string(world_rank_) + " cannot join the " +
                                     what + ": the ranks must be ascending and hold it");
    }
    try {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("gatehouse/" + name + "/" + list, store_);
      c10::intrusive_ptr<c10d::Backend> group =
          make_(prefixed, static_cast<int>(self - ranks.begin()), static_cast<int>(ranks.size()));
      return MakeC10dCommunicator(std::move(group), device_);
    } catch (const std::exception& e) {
      return Status::Unavailable("rank " + std::to_string(world_rank_) + " could not join the " +
                                 what + ": " + e.what());
    }
  }

 private:
  int64_t world_rank_;
  c10::intrusive_ptr<c10d::Store> store_;
  torch::Device device_;
  internal::MakeBackend make_;
  std::string backend_name_;
};

/// gloo's options as JoinGlooGroup describes them: the transport on a loopback master's
/// address (one host), else on this host's own address.
c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> GlooOptions(in_addr master,
                                                                const std::string& master_addr,
                                                                std::chrono::milliseconds timeout) {
  auto gloo = c10d::ProcessGroupGloo::Options::create(timeout);
  gloo->devices.push_back(IsLoopback(master)
                              ? c10d::ProcessGroupGloo::createDeviceForHostname(master_addr)
                              : c10d::ProcessGroupGloo::createDefaultDevice());
  return gloo;
}

}  // namespace

std::shared_ptr<SubgroupFactory> internal::MakeStoreSubgroups(int64_t world_rank,
                                                              c10::intrusive_ptr<c10d::Store> store,
                                                              torch::Device device,
                                                              MakeBackend make,
                                                              std::string backend_name) {
  return std::make_shared<StoreSubgroups>(world_rank, std::move(store), device, std::move(make),
                                          std::move(backend_name));
}

std::shared_ptr<TpCommunicator> MakeC10dCommunicator(c10::intrusive_ptr<c10d::Backend> group,
                                                     torch::Device device) {
  return std::make_shared<C10dCommunicator>(std::move(group), device);
}

Result<RankEnv> ReadRankEnv(const std::function<const char*(const char*)>& getenv) {
  RankEnv env;
  GH_ASSIGN_OR_RETURN(auto world, IntVar(getenv, "WORLD_SIZE"));
  if (!world) return env;
  if (*world < 1) {
    return Status::InvalidArgument("environment variable WORLD_SIZE=" + std::to_string(*world) +
                                   " must be at least 1");
  }
  env.world_size = *world;
  GH_ASSIGN_OR_RETURN(auto rank, IntVar(getenv, "RANK"));
  env.rank = rank.value_or(0);
  if (env.rank < 0 || env.rank >= env.world_size) {
    return Status::InvalidArgument("environment variable RANK=" + std::to_string(env.rank) +
                                   " is outside [0, WORLD_SIZE=" +
                                   std::to_string(env.world_size) + ")");
  }
  GH_ASSIGN_OR_RETURN(auto local, IntVar(getenv, "LOCAL_RANK"));
  env.local_rank = local.value_or(env.rank);
  if (env.world_size == 1) return env;
  const char* addr = getenv("MASTER_ADDR");
  GH_ASSIGN_OR_RETURN(auto port, IntVar(getenv, "MASTER_PORT"));
  if (addr == nullptr || !port) {
    return Status::InvalidArgument(std::string("environment variable ") +
                                   (addr == nullptr ? "MASTER_ADDR" : "MASTER_PORT") +
                                   " is required when WORLD_SIZE=" +
                                   std::to_string(env.world_size));
  }
  if (*port < 1 || *port > 65535) {
    return Status::InvalidArgument("environment variable MASTER_PORT=" + std::to_string(*port) +
                                   " is outside [1, 65535]");
  }
  env.master_addr = addr;
  env.master_port = *port;
  return env;
}

Result<c10::intrusive_ptr<c10d::Store>> ConnectStore(const RankEnv& env,
                                                    std::chrono::milliseconds timeout) {
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(env.master_port);
    opts.numWorkers = static_cast<size_t>(env.world_size);
    opts.waitWorkers = false;
    opts.timeout = timeout;
    if (env.rank == 0) {
      // A loopback master (one host) is bound on that address only; any other is bound on
      // every address, as torchrun's store is: a name of the first node may resolve to another
      // of its addresses there than on the other nodes.
      GH_ASSIGN_OR_RETURN(in_addr master, ResolveMaster(env.master_addr));
      in_addr any{};
      any.s_addr = htonl(INADDR_ANY);
      GH_ASSIGN_OR_RETURN(int fd, ListenOn(IsLoopback(master) ? master : any, env.master_port));
      opts.isServer = true;
      opts.masterListenFd = fd;
    }
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
    return store;
  } catch (const std::exception& e) {
    return Status::Unavailable("rank " + std::to_string(env.rank) + " of " +
                               std::to_string(env.world_size) + " could not reach the store at " +
                               where + ": " + e.what());
  }
}

Result<JoinedGroup> JoinGlooGroup(const RankEnv& env, std::chrono::milliseconds timeout) {
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  GH_ASSIGN_OR_RETURN(in_addr master, ResolveMaster(env.master_addr));
  GH_ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store, ConnectStore(env, timeout));
  try {
    JoinedGroup joined;
    joined.group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        store, env.rank, env.world_size, GlooOptions(master, env.master_addr, timeout));
    joined.subgroups = internal::MakeStoreSubgroups(
        env.rank, store, torch::kCPU,
        [master, addr = env.master_addr, timeout](const c10::intrusive_ptr<c10d::Store>& s,
                                                  int rank, int size) {
          return c10::intrusive_ptr<c10d::Backend>(c10::make_intrusive<c10d::ProcessGroupGloo>(
              s, rank, size, GlooOptions(master, addr, timeout)));
        },
        "gloo");
    return joined;
  } catch (const std::exception& e) {
    return Status::Unavailable("rank " + std::to_string(env.rank) + " of " +
                               std::to_string(env.world_size) + " could not join the gloo group at " +
                               where + ": " + e.what());
  }
}

}  // namespace gatehouse::worker
