#include "local/digest_book.h"

#include <fstream>

#include <nlohmann/json.hpp>

namespace gatehouse::local {

using nlohmann::json;

DigestBookFile::DigestBookFile(std::filesystem::path file) : file_(std::move(file)) {
  std::ifstream in(file_);
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    try {
      controller::FileStamp stamp;
      stamp.size = j.at("size").get<int64_t>();
      stamp.mtime_ns = j.at("mtime_ns").get<int64_t>();
      stamp.ctime_ns = j.at("ctime_ns").get<int64_t>();
      stamp.inode = j.at("inode").get<uint64_t>();
      stamp.device = j.at("device").get<uint64_t>();
      known_[j.at("path").get<std::string>()] = {stamp, j.at("sha256").get<std::string>()};
    } catch (const json::exception&) {
      continue;  // a damaged line: that file is hashed again
    }
  }
}

std::optional<std::string> DigestBookFile::Find(const std::string& path,
                                                const controller::FileStamp& stamp) {
  std::lock_guard lock(mu_);
  auto it = known_.find(path);
  if (it == known_.end() || !(it->second.first == stamp)) return std::nullopt;
  return it->second.second;
}

void DigestBookFile::Record(const std::string& path, const controller::FileStamp& stamp,
                            const std::string& sha256_hex) {
  std::lock_guard lock(mu_);
  known_[path] = {stamp, sha256_hex};
  std::ofstream out(file_, std::ios::app);
  out << json{{"path", path},         {"size", stamp.size},   {"mtime_ns", stamp.mtime_ns},
              {"ctime_ns", stamp.ctime_ns}, {"inode", stamp.inode}, {"device", stamp.device},
              {"sha256", sha256_hex}}
             .dump()
      << "\n";
}

}  // namespace gatehouse::local
