#include "local/tree_resolver.h"

#include <fstream>
#include <sstream>

namespace gatehouse::local {

TreeResolver::TreeResolver(std::filesystem::path tree, std::string head, std::string branch)
    : tree_(std::move(tree)), head_(std::move(head)), branch_(std::move(branch)) {}

Result<std::string> TreeResolver::ResolveBranch(const std::string& /*repository*/,
                                                const std::string& branch) {
  if (!branch_.empty() && branch == branch_) return head_;
  return Status::NotFound("branch '" + branch + "': the working tree " + tree_.string() +
                          " has " + (branch_.empty() ? "a detached HEAD" : "'" + branch_ + "'") +
                          " checked out (a local run builds what is checked out)");
}

Result<std::string> TreeResolver::ResolveCommit(const std::string& /*repository*/,
                                                const std::string& commit) {
  if (commit == head_) return head_;
  return Status::NotFound("commit " + commit + ": the working tree " + tree_.string() +
                          " has HEAD at " + head_ + " (a local run builds what is checked out)");
}

Result<std::optional<std::string>> TreeResolver::ReadFileAt(const std::string& /*repository*/,
                                                            const std::string& /*commit*/,
                                                            const std::string& path) {
  const std::filesystem::path rel = std::filesystem::path(path).lexically_normal();
  if (rel.is_absolute() || rel.empty() || *rel.begin() == "..") {
    return Status::InvalidArgument("file '" + path + "' is not inside the working tree");
  }
  const std::filesystem::path file = tree_ / rel;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return std::optional<std::string>();
  constexpr uintmax_t kMaxBytes = uintmax_t{1} << 20;
  if (std::filesystem::file_size(file, ec) > kMaxBytes) {
    return Status::Internal(file.string() + " is larger than 1 MiB");
  }
  std::ifstream in(file, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (!in && !in.eof()) return Status::Internal("cannot read " + file.string());
  return std::optional<std::string>(bytes.str());
}

}  // namespace gatehouse::local
