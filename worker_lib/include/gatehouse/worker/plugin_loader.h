// Loading model-family plugins (shared libraries built with GATEHOUSE_DEFINE_PLUGIN, see
// model_family.h) into a FamilyRegistry.
#pragma once

#include <filesystem>

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

}  // namespace gatehouse::worker
