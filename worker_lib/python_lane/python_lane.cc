// The Python lane (python_lane.h): a ModelFamily per Python adapter ModelSpec.
#include "python_lane.h"

#include <dlfcn.h>
#include <pybind11/embed.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gatehouse/worker/kv_cache.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::worker::python_lane {
namespace {

namespace py = pybind11;
using nlohmann::json;

/// A Python object whose last reference may be dropped on any thread: the destructor takes the
/// GIL first (the interpreter lives until the process ends; it is never finalised, since
/// LibTorch's and Python's teardown order is not ours to choose).
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(py::object o) : o_(std::move(o)) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() {
    if (!o_ || !Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    o_ = py::object();
  }
  const py::object& get() const { return o_; }

 private:
  py::object o_;
};

/// Runs `f` with the GIL held; a Python exception becomes INVALID_ARGUMENT with `what` and
/// the exception's own message (the adapter's error, for the evidence).
template <typename F>
auto WithGil(const std::string& what, F&& f) -> Result<decltype(f())> {
  py::gil_scoped_acquire gil;
  try {
    return f();
  } catch (py::error_already_set& e) {
    return Status::InvalidArgument(what + ": " + e.what());
  } catch (const py::cast_error& e) {
    return Status::InvalidArgument(what + ": " + e.what());
  }
}

/// The same, for a call that returns nothing.
template <typename F>
Status WithGilVoid(const std::string& what, F&& f) {
  Result<bool> r = WithGil(what, [&] {
    f();
    return true;
  });
  return r.ok() ? Status::Ok() : r.status();
}

/// python/gatehouse_adapter/lane.py, imported once.
py::module_& Lane() {
  static py::module_* lane = new py::module_(py::module_::import("gatehouse_adapter.lane"));
  return *lane;
}

py::list ToPy(const NamedTensors& tensors) {
  py::list out;
  for (const auto& [name, t] : tensors) out.append(py::make_tuple(name, t));
  return out;
}

NamedTensors FromPy(const py::handle& list) {
  NamedTensors out;
  for (const py::handle item : list) {
    auto pair = item.cast<py::tuple>();
    out.emplace_back(pair[0].cast<std::string>(), pair[1].cast<at::Tensor>());
  }
  return out;
}

// --- args ------------------------------------------------------------------------------------

/// An adapter's args object, the gate facts lane.gate_facts read from it, and the adapter's
/// state-dict adapter for these args (one instance: it may remember what from_hf read).
class PyArgs final : public ModelArgs {
 public:
  PyArgs(py::object args, json facts, json as_json)
      : args_(std::move(args)), facts_(std::move(facts)), json_(std::move(as_json)) {}
  json ToJson() const override { return json_; }
  int64_t vocab_size() const override { return facts_.at("vocab_size").get<int64_t>(); }
  int64_t num_hidden_layers() const override {
    return facts_.at("num_hidden_layers").get<int64_t>();
  }
  int64_t num_key_value_heads() const override {
    return facts_.at("num_key_value_heads").get<int64_t>();
  }
  int64_t head_dim() const override { return facts_.at("head_dim").get<int64_t>(); }
  int64_t max_position_embeddings() const override {
    return facts_.at("max_position_embeddings").get<int64_t>();
  }
  bool tie_word_embeddings() const override { return facts_.at("tie_word_embeddings").get<bool>(); }
  int64_t min_sliding_window() const override {
    return facts_.at("min_sliding_window").get<int64_t>();
  }

  const py::object& object() const { return args_.get(); }
  /// lane.state_dict_adapter(spec, args), made on first use. Call with the GIL held.
  const py::object& Adapter(const py::object& spec) const {
    std::call_once(adapter_once_, [&] {
      adapter_ = std::make_unique<PyRef>(Lane().attr("state_dict_adapter")(spec, args_.get()));
    });
    return adapter_->get();
  }

 private:
  PyRef args_;
  json facts_;
  json json_;
  mutable std::once_flag adapter_once_;
  mutable std::unique_ptr<PyRef> adapter_;
};

// --- model -----------------------------------------------------------------------------------

/// A Python nn.Module seen as a CausalLM. Its parameters are registered on this module under
/// the same dotted names (nested empty modules), as the same tensors: the gates' optimizer,
/// gradients and loads act on the Python module's own storage.
///
/// A cached Forward goes through the adapter's own KV cache when its SPEC gives one
/// (init_cache / decode_forward, docs/protocols.md §9): the KVCache the gates hold is then a
/// handle, and the adapter's cache object lives beside it here. Without one (Archon's forward
/// has no cache) Forward keeps the tokens and positions so far and recomputes the whole
/// sequence, returning the new positions' logits: the decode gates then compare
/// teacher-forced logits (which they also bar against upstream).
///
/// A module sharded by the adapter's parallelize (and data_parallel) holds DTensor parameters:
/// this module then registers each one's local shard (what this rank holds, for the parallel
/// gate's per-rank counts; the tensor the gates step in place), gradients land on the DTensors
/// (LocalGradients reads this rank's part), and FullTensors / FullOfLocal gather. A sharded
/// module decodes by recomputation (no gate decodes after parallelize). Construct with the GIL
/// held.
class PyCausalLM final : public CausalLM {
 public:
  PyCausalLM(py::object module, py::object spec, bool sharded)
      : module_(std::move(module)),
        spec_(std::move(spec)),
        sharded_(sharded),
        caches_kv_(!sharded && Lane().attr("caches_keys_and_values")(spec_.get()).cast<bool>()),
        reduces_dp_(sharded && Lane().attr("reduces_data_parallel")(module_.get()).cast<bool>()) {
    const py::list named = Lane().attr("local_parameters")(module_.get());
    for (const py::handle item : named) {
      auto pair = item.cast<py::tuple>();
      Mirror(pair[0].cast<std::string>(), pair[1].cast<at::Tensor>());
    }
  }

  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& positions,
                        KVCache* cache) override {
    if (cache == nullptr) return Call(tokens, positions, std::nullopt);
    auto it = caches_.find(cache);
    TORCH_CHECK(it != caches_.end() && it->second.Alive(),
                "Python-lane cache: not made by this model's NewKVCache");
    CacheState& state = it->second;
    const int64_t t_new = tokens.size(1);
    TORCH_CHECK(cache->length() + t_new <= cache->max_len(), "KVCache overflow: ",
                cache->length(), " + ", t_new, " > max_len ", cache->max_len());
    torch::Tensor logits = caches_kv_ ? CachedCall(state, tokens, positions, *cache)
                                      : RecomputedCall(state, tokens, positions, *cache);
    cache->Advance(t_new);
    return logits;
  }

  /// A KVCache handle of max_len positions (its one small buffer only marks its lifetime);
  /// the adapter's cache for `batch` rows is made by init_cache at the first Forward on it.
  std::unique_ptr<KVCache> NewKVCache(int64_t batch, int64_t max_len) const override {
    (void)batch;  // the adapter's cache takes the batch of the prefill's tokens
    auto cache = std::make_unique<KVCache>(1, 1, 1, max_len, 1, torch::kFloat32, torch::kCPU);
    // WriteAt returns the cache's own buffer tensor: while the KVCache lives it holds a second
    // reference, so CacheState::Alive tells a live handle from a freed one at the same address.
    const torch::Tensor zero = torch::zeros({1, 1, 1, 1});
    torch::Tensor buffer = cache->WriteAt(0, zero, zero, torch::zeros({1}, torch::kLong)).first;
    for (auto it = caches_.begin(); it != caches_.end();) {
      it = it->second.Alive() ? std::next(it) : caches_.erase(it);
    }
    caches_[cache.get()] = CacheState{std::move(buffer), nullptr, {}, {}, 0};
    return cache;
  }

  bool CachesKeysAndValues() const override { return caches_kv_; }
  bool SupportsPacked() const override { return true; }
  torch::Tensor ForwardPacked(const torch::Tensor& tokens, const torch::Tensor& positions,
                              const torch::Tensor& cu_seqlens) override {
    return Call(tokens, positions, cu_seqlens);
  }

  void train(bool on) override {
    torch::nn::Module::train(on);
    Status s = WithGilVoid("train", [&] { module_.get().attr("train")(on); });
    TORCH_CHECK(s.ok(), s.ToString());
  }

  /// The registered tensors are the module's own parameters, except for a sharded module,
  /// whose gradients live on its DTensors: those are dropped in Python.
  void zero_grad(bool set_to_none) override {
    torch::nn::Module::zero_grad(set_to_none);
    if (!sharded_) return;
    Status s = WithGilVoid("zero_grad", [&] { Lane().attr("zero_grad")(module_.get()); });
    TORCH_CHECK(s.ok(), s.ToString());
  }

  Result<NamedTensors> FullTensors(bool gradients) override {
    Result<NamedTensors> out = WithGil(gradients ? "gathering full gradients" : "gathering full parameters", [&] {
      return FromPy(Lane().attr("full_tensors")(module_.get(), gradients));
    });
    if (!out.ok()) return Status::Internal(out.status().message());
    return std::move(out).value();
  }

  Result<NamedTensors> LocalGradients() override {
    if (!sharded_) return Status::FailedPrecondition("this model was not sharded by parallelize");
    Result<NamedTensors> out = WithGil("reading the local gradients", [&] {
      return FromPy(Lane().attr("local_gradients")(module_.get()));
    });
    if (!out.ok()) return Status::Internal(out.status().message());
    return std::move(out).value();
  }

  bool ReducesDataParallelGradients() const override { return reduces_dp_; }

  Result<double> ClippingGradNorm() override {
    if (!sharded_) return Status::FailedPrecondition("this model was not sharded by parallelize");
    Result<double> out = WithGil("the clipping grad norm", [&] {
      return Lane().attr("clipping_grad_norm")(spec_.get(), module_.get()).cast<double>();
    });
    if (!out.ok()) return Status::Internal(out.status().message());
    return *out;
  }

  /// The adapter's MoE blocks' `tokens_per_expert` buffers (lane.py expert_token_counts):
  /// [moe_layers, E] int64, undefined for a model without one.
  torch::Tensor ExpertTokenCounts() const override {
    torch::Tensor counts;
    Status s = WithGilVoid("reading tokens_per_expert", [&] {
      py::object t = Lane().attr("expert_token_counts")(module_.get());
      if (!t.is_none()) counts = t.cast<at::Tensor>();
    });
    TORCH_CHECK(s.ok(), s.ToString());
    return counts;
  }
  /// The adapter's MoE blocks' `router_near_ties` buffers, summed (lane.py expert_near_ties).
  int64_t ExpertNearTies() const override {
    int64_t ties = 0;
    Status s = WithGilVoid("reading router_near_ties", [&] {
      ties = Lane().attr("expert_near_ties")(module_.get()).cast<int64_t>();
    });
    TORCH_CHECK(s.ok(), s.ToString());
    return ties;
  }
  void ResetExpertTokenCounts() override {
    Status s = WithGilVoid("zeroing tokens_per_expert", [&] {
      Lane().attr("reset_expert_token_counts")(module_.get());
    });
    TORCH_CHECK(s.ok(), s.ToString());
  }

  Result<NamedTensors> FullOfLocal(const NamedTensors& local) override {
    if (!sharded_) return Status::FailedPrecondition("this model was not sharded by parallelize");
    Result<NamedTensors> out = WithGil("gathering full tensors from local shards", [&] {
      return FromPy(Lane().attr("full_of_local")(module_.get(), ToPy(local)));
    });
    if (!out.ok()) {
      // lane.py raises ValueError for a name or shape that does not fit the model.
      return out.status().message().find("ValueError") != std::string::npos
                 ? Status::InvalidArgument(out.status().message())
                 : Status::Internal(out.status().message());
    }
    return std::move(out).value();
  }

  const py::object& module() const { return module_.get(); }

 private:
  /// What this model keeps for one KVCache handle of its own making.
  struct CacheState {
    torch::Tensor buffer;             // the handle's buffer (Alive)
    std::shared_ptr<PyRef> py_cache;  // the adapter's cache (init_cache), when it has one
    torch::Tensor tokens, positions;  // without one: the sequence so far, [B, length]
    int64_t length = 0;               // positions the adapter's cache or the history holds
    /// False once the KVCache handle is destroyed (this holds the last reference).
    bool Alive() const { return buffer.use_count() > 1; }
  };

  /// The adapter's decode_forward over the new positions, on a fresh init_cache when the
  /// handle is empty (new, or Reset).
  torch::Tensor CachedCall(CacheState& state, const torch::Tensor& tokens,
                           const torch::Tensor& positions, const KVCache& cache) {
    py::gil_scoped_acquire gil;
    try {
      if (cache.length() == 0) {
        state.py_cache = std::make_shared<PyRef>(Lane().attr("init_cache")(
            spec_.get(), module_.get(), tokens.size(0), cache.max_len()));
        state.length = 0;
      }
      TORCH_CHECK(state.py_cache && state.length == cache.length(),
                  "Python-lane cache: the adapter's cache holds ", state.length,
                  " positions, the KVCache says ", cache.length());
      at::Tensor logits = Lane().attr("decode_forward")(spec_.get(), module_.get(), tokens,
                                                        positions, state.py_cache->get())
                              .cast<at::Tensor>();
      state.length += tokens.size(1);
      return logits;
    } catch (py::error_already_set& e) {
      // The gate runner turns a c10::Error into FAIL (native_runtime) with this message.
      TORCH_CHECK(false, "the Python model's decode_forward raised: ", e.what());
    } catch (const py::cast_error& e) {
      TORCH_CHECK(false, "the Python model's decode_forward did not return a Tensor: ", e.what());
    }
  }

  /// The whole sequence so far through forward; the new positions' logits.
  torch::Tensor RecomputedCall(CacheState& state, const torch::Tensor& tokens,
                               const torch::Tensor& positions, const KVCache& cache) {
    if (cache.length() == 0) {
      state.tokens = tokens;
      state.positions = positions;
    } else {
      TORCH_CHECK(state.tokens.defined() && state.tokens.size(1) == cache.length(),
                  "Python-lane cache: it holds ",
                  state.tokens.defined() ? state.tokens.size(1) : 0,
                  " positions, the cache says ", cache.length());
      state.tokens = torch::cat({state.tokens, tokens}, 1);
      state.positions = torch::cat({state.positions, positions}, 1);
    }
    const int64_t t_new = tokens.size(1);
    torch::Tensor logits = Call(state.tokens, state.positions, std::nullopt);
    return logits.slice(1, logits.size(1) - t_new).contiguous();
  }

  torch::Tensor Call(const torch::Tensor& tokens, const torch::Tensor& positions,
                     const std::optional<torch::Tensor>& cu_seqlens) {
    py::gil_scoped_acquire gil;
    try {
      py::object out = cu_seqlens ? Lane().attr("forward")(module_.get(), tokens, positions,
                                                          *cu_seqlens)
                                  : Lane().attr("forward")(module_.get(), tokens, positions);
      return out.cast<at::Tensor>();
    } catch (py::error_already_set& e) {
      // The gate runner turns a c10::Error into FAIL (native_runtime) with this message.
      TORCH_CHECK(false, "the Python model's forward raised: ", e.what());
    } catch (const py::cast_error& e) {
      TORCH_CHECK(false, "the Python model's forward did not return a Tensor: ", e.what());
    }
  }

  /// Registers `tensor` under `dotted` ("layers.0.attention.wq.weight"), making the nested
  /// modules the path names.
  void Mirror(const std::string& dotted, const at::Tensor& tensor) {
    torch::nn::Module* at = this;
    size_t begin = 0;
    for (size_t dot = dotted.find('.'); dot != std::string::npos; dot = dotted.find('.', begin)) {
      const std::string part = dotted.substr(begin, dot - begin);
      std::shared_ptr<torch::nn::Module> child;
      for (const auto& item : at->named_children()) {
        if (item.key() == part) child = item.value();
      }
      if (!child) child = at->register_module(part, std::make_shared<torch::nn::Module>());
      at = child.get();
      begin = dot + 1;
    }
    at->register_parameter(dotted.substr(begin), tensor, tensor.requires_grad());
  }

  PyRef module_;
  PyRef spec_;
  bool sharded_;
  bool caches_kv_;
  bool reduces_dp_;  // the adapter's data_parallel was applied (lane.py reduces_data_parallel)
  // Per KVCache handle made by NewKVCache (const, as the gates call it); freed handles are
  // dropped at the next NewKVCache.
  mutable std::unordered_map<const KVCache*, CacheState> caches_;
};

// --- family ----------------------------------------------------------------------------------

/// One Python adapter's ModelSpec as a ModelFamily. Weights are mapped by code (the adapter's
/// from_hf / to_hf), so Adapter() has no table to give.
class PyFamily final : public ModelFamily {
 public:
  PyFamily(py::object spec, std::string name, std::vector<std::string> model_types,
           std::string entry, bool has_parallelize)
      : spec_(std::move(spec)),
        name_(std::move(name)),
        model_types_(std::move(model_types)),
        entry_(std::move(entry)),
        has_parallelize_(has_parallelize) {}

  std::string_view name() const override { return name_; }
  std::vector<std::string> model_types() const override { return model_types_; }

  Result<ParsedConfig> ParseConfig(const json& config) const override {
    std::string refused;  // args_from_hf_config's ValueError, naming the field and value
    Result<ParsedConfig> parsed = WithGil(entry_ + ": parsing config.json", [&] {
      py::tuple r = Lane().attr("parse_config")(spec_.get(), config.dump());
      ParsedConfig out;
      if (!r[2].is_none()) {
        refused = r[2].cast<std::string>();
        return out;
      }
      const py::dict accounting = r[1].cast<py::dict>();
      for (const auto& [field, value] : config.items()) {
        if (!accounting.contains(field)) {
          out.report.unmapped.push_back(field);
        } else if (py::object v = accounting[py::str(field)]; v.is_none()) {
          out.report.mapped.push_back(field);
        } else {
          out.report.ignored.emplace_back(field, v.cast<std::string>());
        }
      }
      py::object args = r[0];
      const json facts =
          json::parse(py::module_::import("json").attr("dumps")(
                          Lane().attr("gate_facts")(spec_.get(), args)).cast<std::string>());
      const json as_json = json::parse(Lane().attr("args_json")(args).cast<std::string>());
      out.args = std::make_shared<PyArgs>(std::move(args), facts, as_json);
      return out;
    });
    if (!parsed.ok()) return parsed.status();
    if (!refused.empty()) return Status::InvalidArgument(refused);
    return std::move(parsed).value();
  }

  Result<std::shared_ptr<CausalLM>> Construct(const ModelArgs& args, torch::Dtype dtype,
                                              torch::Device device) const override {
    const auto* py_args = dynamic_cast<const PyArgs*>(&args);
    if (py_args == nullptr) return Status::InvalidArgument("args not parsed by " + entry_);
    const std::string dtype_name = dtype == torch::kBFloat16 ? "bfloat16"
                                   : dtype == torch::kFloat16 ? "float16"
                                   : dtype == torch::kFloat64 ? "float64"
                                                              : "float32";
    Result<std::shared_ptr<CausalLM>> built =
        WithGil(entry_ + ": build_model", [&]() -> std::shared_ptr<CausalLM> {
          py::object module = Lane().attr("build_model")(spec_.get(), py_args->object(),
                                                         dtype_name, device.str());
          return std::make_shared<PyCausalLM>(std::move(module), spec_.get(), /*sharded=*/false);
        });
    if (!built.ok()) return built.status();
    return std::move(built).value();
  }

  Result<StateDictAdapter> Adapter(const ModelArgs&) const override {
    return Status::FailedPrecondition(entry_ + " maps weights by code (from_hf / to_hf)");
  }
  bool MapsWeightsByCode() const override { return true; }

  Result<NamedTensors> FromHf(const ModelArgs& args, const NamedTensors& hf) const override {
    return Map(args, hf, "from_hf");
  }
  Result<NamedTensors> ToHf(const ModelArgs& args, const NamedTensors& params) const override {
    return Map(args, params, "to_hf");
  }

  /// The SPEC's parallelize and data_parallel, when it gives either, over torch.distributed's
  /// own group (lane.py join_group: the worker's rendezvous store, a key prefix of its own).
  bool ShardsLoadedModel() const override { return has_parallelize_; }
  Result<std::shared_ptr<CausalLM>> ShardLoaded(std::shared_ptr<CausalLM> model,
                                                const TensorParallel& tp, int64_t world_rank,
                                                int64_t world_size,
                                                const ExpertGroups& experts) const override {
    auto* py_model = dynamic_cast<PyCausalLM*>(model.get());
    if (py_model == nullptr) return Status::InvalidArgument("model not built by " + entry_);
    const torch::Device device = [&] {
      for (const auto& p : py_model->parameters()) return p.device();
      return torch::Device(torch::kCPU);
    }();
    // The worker's own group timeout, which worker_main exports for this group.
    const char* timeout = std::getenv("GATEHOUSE_GROUP_TIMEOUT_S");
    if (timeout == nullptr || std::atoi(timeout) <= 0) {
      return Status::Unavailable("GATEHOUSE_GROUP_TIMEOUT_S is not set (the worker sets it when "
                                 "it joins a rank group)");
    }
    Status joined = WithGilVoid("joining torch.distributed's group", [&] {
      Lane().attr("join_group")(world_rank, world_size, device.str(), std::atoi(timeout));
    });
    if (!joined.ok()) return Status::Unavailable(joined.message());
    Result<std::shared_ptr<CausalLM>> sharded =
        WithGil(entry_ + ": parallelize", [&]() -> std::shared_ptr<CausalLM> {
          py::object ep = py::none(), replicas = py::none();
          if (experts.enabled()) {
            ep = py::cast(experts.ep);
            replicas = py::cast(experts.replicas);
          }
          py::object module = Lane().attr("parallelize")(spec_.get(), py_model->module(), tp.size,
                                                          ep, replicas);
          return std::make_shared<PyCausalLM>(std::move(module), spec_.get(), /*sharded=*/true);
        });
    if (!sharded.ok()) return sharded.status();
    return std::move(sharded).value();
  }

 private:
  Result<NamedTensors> Map(const ModelArgs& args, const NamedTensors& in,
                           const char* method) const {
    const auto* py_args = dynamic_cast<const PyArgs*>(&args);
    if (py_args == nullptr) return Status::InvalidArgument("args not parsed by " + entry_);
    Result<NamedTensors> out = WithGil(entry_ + ": " + method, [&] {
      const py::object& adapter = py_args->Adapter(spec_.get());
      return FromPy(Lane().attr(method)(adapter, ToPy(in)));
    });
    if (!out.ok()) return out.status();
    return std::move(out).value();
  }

  PyRef spec_;
  std::string name_;
  std::vector<std::string> model_types_;
  std::string entry_;
  bool has_parallelize_;
};

/// Makes libpython's symbols global (extension modules such as torch._C expect them from the
/// process, and this library was opened RTLD_LOCAL), then starts the interpreter once and
/// releases the GIL for good: every call into Python takes it (WithGil), and autograd's
/// backward, run by the gates in C++, must not be entered holding it.
Status StartInterpreter() {
  static Status started = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&Py_IsInitialized), &info) == 0 ||
        info.dli_fname == nullptr ||
        dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL) == nullptr) {
      return Status::Internal("cannot make libpython's symbols global");
    }
    if (Py_IsInitialized()) return Status::Ok();
    py::initialize_interpreter(/*init_signal_handlers=*/false);
    try {
      py::module_ sys = py::module_::import("sys");
      sys.attr("argv") = py::make_tuple("gatehouse-worker");
      // The worker's own package and the torch wheel it was built against, behind whatever
      // the caller puts in front.
      sys.attr("path").attr("insert")(0, std::string(GATEHOUSE_PYTHON_SDK_DIR));
      sys.attr("path").attr("insert")(1, std::string(GATEHOUSE_TORCH_SITE_PACKAGES));
    } catch (py::error_already_set& e) {
      PyEval_SaveThread();
      return Status::Internal(std::string("python lane: starting the interpreter: ") + e.what());
    }
    PyEval_SaveThread();
    return Status::Ok();
  }();
  return started;
}

Status Register(FamilyRegistry& registry, const json& config) {
  GH_RETURN_IF_ERROR(StartInterpreter());
  std::vector<std::string> entries, sys_path;
  if (config.contains("entries")) entries = config["entries"].get<std::vector<std::string>>();
  if (config.contains("sys_path")) sys_path = config["sys_path"].get<std::vector<std::string>>();
  if (entries.empty()) return Status::InvalidArgument("python lane: no entry given");
  std::vector<std::unique_ptr<ModelFamily>> families;
  for (const std::string& entry : entries) {
    Result<std::unique_ptr<ModelFamily>> family =
        WithGil("python entry " + entry, [&]() -> std::unique_ptr<ModelFamily> {
          py::object path = py::module_::import("sys").attr("path");
          for (auto it = sys_path.rbegin(); it != sys_path.rend(); ++it) {
            if (!path.contains(py::str(*it))) path.attr("insert")(0, py::str(*it));
          }
          py::object spec = Lane().attr("load_spec")(entry);
          auto name = spec.attr("name").cast<std::string>();
          auto types = spec.attr("model_types").cast<std::vector<std::string>>();
          // parallelize (tensor parallelism) or data_parallel (the adapter's FSDP2): either
          // shards a loaded model by the adapter's code.
          const bool has_parallelize = !py::getattr(spec, "parallelize", py::none()).is_none() ||
                                       !py::getattr(spec, "data_parallel", py::none()).is_none();
          return std::make_unique<PyFamily>(std::move(spec), std::move(name), std::move(types),
                                            entry, has_parallelize);
        });
    if (!family.ok()) return family.status();
    families.push_back(std::move(family).value());
  }
  for (auto& f : families) GH_RETURN_IF_ERROR(registry.Register(std::move(f)));
  return Status::Ok();
}

}  // namespace
}  // namespace gatehouse::worker::python_lane

extern "C" __attribute__((visibility("default"))) int gatehouse_python_lane_register(
    void* registry, const char* config_json, char* error, int error_size) {
  using gatehouse::Status;
  Status s = [&]() -> Status {
    const auto config = nlohmann::json::parse(config_json ? config_json : "{}", nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return Status::InvalidArgument("python lane: the configuration is not a JSON object");
    }
    try {
      return gatehouse::worker::python_lane::Register(
          *static_cast<gatehouse::worker::FamilyRegistry*>(registry), config);
    } catch (const std::exception& e) {
      return Status::InvalidArgument(std::string("python lane: ") + e.what());
    }
  }();
  if (s.ok()) return 0;
  const std::string m = s.ToString();
  if (error_size > 0) {
    const size_t n = std::min(m.size(), static_cast<size_t>(error_size - 1));
    std::memcpy(error, m.data(), n);
    error[n] = '\0';
  }
  return 1;
}

extern "C" __attribute__((visibility("default"))) void gatehouse_python_lane_before_exit() {
  if (Py_IsInitialized()) PyGILState_Ensure();  // never released: the process is exiting
}
