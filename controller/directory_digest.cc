#include "controller/directory_digest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/sha256.h"

namespace gatehouse::controller {

namespace fs = std::filesystem;

Result<FileStamp> StampOf(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::NotFound("cannot stat file '" + path.string() + "': " + std::strerror(errno));
  }
  auto ns = [](const timespec& t) {
    return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + static_cast<int64_t>(t.tv_nsec);
  };
  return FileStamp{static_cast<int64_t>(st.st_size), ns(st.st_mtim), ns(st.st_ctim),
                   static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev)};
}

Result<std::vector<ListedFile>> ListDirectoryFiles(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound("'" + dir.string() + "' is not a directory");
  }
  const fs::path base = dir.lexically_normal();
  std::vector<ListedFile> files;
  // The walk of DirectoryDigest (common/sha256.cc): the same iterator, the same test.
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    ListedFile f;
    f.rel = it->path().lexically_relative(dir).generic_string();
    f.path = base / f.rel;
    GH_ASSIGN_OR_RETURN(f.stamp, StampOf(f.path));
    files.push_back(std::move(f));
  }
  if (ec) return Status::DataLoss("cannot list '" + dir.string() + "': " + ec.message());
  if (files.empty()) return Status::NotFound("directory '" + dir.string() + "' holds no file");
  std::sort(files.begin(), files.end(),
            [](const ListedFile& a, const ListedFile& b) { return a.rel < b.rel; });
  return files;
}

std::string DirectoryDigestOf(std::vector<FileDigest> files) {
  std::sort(files.begin(), files.end(),
            [](const FileDigest& a, const FileDigest& b) { return a.rel < b.rel; });
  Sha256 tree;
  for (const FileDigest& f : files) {
    tree.Update(f.rel + "\t" + std::to_string(f.size) + "\t" + f.sha256_hex + "\n");
  }
  return "sha256:" + tree.FinalHex();
}

Result<std::string> HashFile(const fs::path& path, size_t block_bytes,
                             const std::function<bool(int64_t bytes)>& on_block) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::NotFound("cannot open file '" + path.string() + "': " + std::strerror(errno));
  }
  Sha256 h;
  std::string buf(std::max<size_t>(block_bytes, 1), '\0');
  Status status;
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = Status::DataLoss("read error in '" + path.string() + "': " + std::strerror(errno));
      break;
    }
    if (n == 0) break;
    h.Update(std::string_view(buf.data(), static_cast<size_t>(n)));
    if (on_block && !on_block(n)) {
      status = Status::Unavailable("hashing '" + path.string() + "' stopped");
      break;
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  return h.FinalHex();
}

}  // namespace gatehouse::controller
