// Reading small files whole (certificates, keys, token files, recipes).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

#include "common/status.h"

namespace gatehouse {

/// The bytes of a regular file. Errors: NOT_FOUND when it does not exist or cannot be opened
/// (naming `what` and the path), RESOURCE_EXHAUSTED when it is over `max_bytes`.
Result<std::string> ReadFileToString(const std::filesystem::path& path, const std::string& what,
                                     size_t max_bytes = 16 * 1024 * 1024);

/// A secret kept in a file (a token): its text without trailing whitespace (the newline an
/// editor or `> file` leaves). Errors as ReadFileToString (limit 4096 bytes); INVALID_ARGUMENT
/// when nothing is left.
Result<std::string> ReadSecretFile(const std::filesystem::path& path, const std::string& what);

}  // namespace gatehouse
