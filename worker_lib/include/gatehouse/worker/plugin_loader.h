// Loading model-family plugins (shared libraries built with GATEHOUSE_DEFINE_PLUGIN, see
// model_family.h) into a FamilyRegistry.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "common/status.h"

namespace gatehouse::worker {

class FamilyRegistry;

/// dlopen()s `path` (RTLD_NOW | RTLD_LOCAL), checks gatehouse_plugin_abi_version() against
/// kPluginAbiVersion and calls gatehouse_plugin_register(&registry). The library stays loaded
/// for the life of the process (the registry holds objects whose code lives in it).
/// Errors: UNAVAILABLE "plugin <path> failed to load: <dlerror>", FAILED_PRECONDITION for a
/// missing entry point or another ABI version, INVALID_ARGUMENT with the plugin's own message
/// when registration fails.
Status LoadPlugin(const std::filesystem::path& path, FamilyRegistry& registry);

/// Loads the Python lane (`lane_library`: libgatehouse_python_lane.so, python_lane.h) and
/// registers one family per entry ("package.module:SPEC", a gatehouse_adapter.ModelSpec),
/// with `sys_path` in front of the interpreter's path. Errors: UNAVAILABLE when the library
/// does not load (or this worker was built without it: empty path), INVALID_ARGUMENT with the
/// lane's message (an entry that does not import, names a non-spec, or a taken family name).
Status LoadPythonLane(const std::filesystem::path& lane_library,
                      const std::vector<std::string>& entries,
                      const std::vector<std::string>& sys_path, FamilyRegistry& registry);

/// Called by the worker just before it exits, on its main thread, after a Python lane was
/// loaded (a no-op otherwise): the lane takes the GIL for good, so the Python objects torch
/// keeps in this thread's thread-local storage (DTensor's sharding cache, filled by the
/// parallel gate) are released with it held when the thread's destructors run at exit. The
/// interpreter is never finalised.
void PythonLaneBeforeExit();

}  // namespace gatehouse::worker
