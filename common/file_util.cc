#include "common/file_util.h"

#include <cctype>
#include <fstream>
#include <iterator>
#include <system_error>

namespace gatehouse {

Result<std::string> ReadFileToString(const std::filesystem::path& path, const std::string& what,
                                     size_t max_bytes) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return Status::NotFound(what + " '" + path.string() + "': not a readable file");
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return Status::NotFound(what + " '" + path.string() + "': " + ec.message());
  if (size > max_bytes) {
    return Status::ResourceExhausted(what + " '" + path.string() + "': " + std::to_string(size) +
                                     " bytes, over the limit of " + std::to_string(max_bytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(what + " '" + path.string() + "': cannot open");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::NotFound(what + " '" + path.string() + "': read error");
  return text;
}

Result<std::string> ReadSecretFile(const std::filesystem::path& path, const std::string& what) {
  auto text = ReadFileToString(path, what, 4096);
  if (!text.ok()) return text.status();
  std::string secret = std::move(text).value();
  while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) {
    secret.pop_back();
  }
  if (secret.empty()) return Status::InvalidArgument(what + " '" + path.string() + "' is empty");
  return secret;
}

}  // namespace gatehouse
