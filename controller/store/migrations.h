// The numbered schema files of migrations/, embedded into the binary at build time
// (controller/store/embed_migrations.cmake generates the definition), so the daemon does not need
// the source tree.
#pragma once

#include <span>
#include <string_view>

namespace gatehouse::controller {

/// One file migrations/<version>_<name>.sql.
struct Migration {
  int version;            // from the 4-digit prefix, 1, 2, ...
  std::string_view name;  // the part after the prefix, without ".sql"
  std::string_view sql;   // the file's contents
};

/// All embedded migrations in ascending version order.
std::span<const Migration> EmbeddedMigrations();

}  // namespace gatehouse::controller
