// Model-family plugin loading (model_family.h: plugin entry points).
#include "gatehouse/worker/plugin_loader.h"

#include <dlfcn.h>

#include <nlohmann/json.hpp>
#include <string>

#include "gatehouse/worker/model_family.h"

namespace gatehouse::worker {

Status LoadPlugin(const std::filesystem::path& path, FamilyRegistry& registry) {
  const std::string where = "plugin " + path.string();
  dlerror();  // clear
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return Status::Unavailable(where + " failed to load: " + (err ? err : "unknown dlopen error"));
  }
  auto abi = reinterpret_cast<GatehousePluginAbiVersionFn>(
      dlsym(handle, "gatehouse_plugin_abi_version"));
  auto reg = reinterpret_cast<GatehousePluginRegisterFn>(
      dlsym(handle, "gatehouse_plugin_register"));
  if (abi == nullptr || reg == nullptr) {
    return Status::FailedPrecondition(
        where + " failed to load: it does not export " +
        (abi == nullptr ? "gatehouse_plugin_abi_version" : "gatehouse_plugin_register") +
        " (define it with GATEHOUSE_DEFINE_PLUGIN)");
  }
  const int version = abi();
  if (version != kPluginAbiVersion) {
    return Status::FailedPrecondition(where + " failed to load: plugin ABI version " +
                                      std::to_string(version) + ", this worker expects " +
                                      std::to_string(kPluginAbiVersion));
  }
  char error[1024] = {0};
  if (reg(&registry, error, static_cast<int>(sizeof(error))) != 0) {
    return Status::InvalidArgument(where + " failed to register: " +
                                   (error[0] ? std::string(error) : std::string("no message")));
  }
  // Never dlclose: the registry holds family objects whose vtables live in the library.
  return Status::Ok();
}

namespace {
/// The loaded lane's gatehouse_python_lane_before_exit, if any.
void (*python_lane_before_exit)() = nullptr;
}  // namespace

Status LoadPythonLane(const std::filesystem::path& lane_library,
                      const std::vector<std::string>& entries,
                      const std::vector<std::string>& sys_path, FamilyRegistry& registry) {
  if (lane_library.empty()) {
    return Status::Unavailable("python lane: this worker was built without it (no python3.11-dev "
                               "or no libtorch_python at configure time)");
  }
  const std::string where = "python lane " + lane_library.string();
  dlerror();
  void* handle = dlopen(lane_library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return Status::Unavailable(where + " failed to load: " + (err ? err : "unknown dlopen error"));
  }
  using RegisterFn = int (*)(void*, const char*, char*, int);
  auto reg = reinterpret_cast<RegisterFn>(dlsym(handle, "gatehouse_python_lane_register"));
  if (reg == nullptr) {
    return Status::FailedPrecondition(where + " does not export gatehouse_python_lane_register");
  }
  const std::string config =
      nlohmann::json{{"entries", entries}, {"sys_path", sys_path}}.dump();
  char error[4096] = {0};
  if (reg(&registry, config.c_str(), error, static_cast<int>(sizeof(error))) != 0) {
    return Status::InvalidArgument(error[0] ? std::string(error) : where + ": no message");
  }
  python_lane_before_exit = reinterpret_cast<void (*)()>(dlsym(handle, "gatehouse_python_lane_before_exit"));
  return Status::Ok();
}

void PythonLaneBeforeExit() {
  if (python_lane_before_exit != nullptr) python_lane_before_exit();
}

}  // namespace gatehouse::worker
