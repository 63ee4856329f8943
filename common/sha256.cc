#include "common/sha256.h"

#include <openssl/evp.h>

#include <algorithm>
#include <fstream>
#include <vector>

namespace gatehouse {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr);
}

Sha256::~Sha256() { EVP_MD_CTX_free(impl_->ctx); }

void Sha256::Update(std::string_view bytes) {
  EVP_DigestUpdate(impl_->ctx, bytes.data(), bytes.size());
}

std::string Sha256::FinalHex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(impl_->ctx, digest, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xf]);
  }
  return out;
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.FinalHex();
}

namespace {

// The file's SHA-256, each 1 MiB block also handed to `observer` (when given) after hashing.
Result<std::string> HashFile(const std::filesystem::path& path, DigestObserver* observer) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open file '" + path.string() + "'");
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    std::streamsize n = in.gcount();
    if (n <= 0) continue;
    const std::string_view block(buf.data(), static_cast<size_t>(n));
    h.Update(block);
    if (observer != nullptr) observer->Bytes(block);
  }
  if (in.bad()) return Status::DataLoss("read error in '" + path.string() + "'");
  return h.FinalHex();
}

}  // namespace

Result<std::string> Sha256FileHex(const std::filesystem::path& path) {
  return HashFile(path, nullptr);
}

Result<std::string> DirectoryDigest(const std::filesystem::path& dir, DigestObserver* observer) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound("'" + dir.string() + "' is not a directory");
  }
  std::vector<fs::path> files;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    // Named by the entry's own path (a symlinked file keeps its name: a Hub cache snapshot's
    // links point into ../../blobs/).
    if (it->is_regular_file(ec)) files.push_back(it->path().lexically_relative(dir));
  }
  if (ec) return Status::DataLoss("cannot list '" + dir.string() + "': " + ec.message());
  if (files.empty()) return Status::NotFound("directory '" + dir.string() + "' holds no file");
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.generic_string() < b.generic_string(); });
  Sha256 tree;
  for (const fs::path& rel : files) {
    auto size = fs::file_size(dir / rel, ec);
    if (observer != nullptr) observer->BeginFile(rel.generic_string(), ec ? 0 : size);
    GH_ASSIGN_OR_RETURN(std::string file_hex, HashFile(dir / rel, observer));
    if (observer != nullptr) observer->EndFile();
    tree.Update(rel.generic_string() + "\t" + std::to_string(size) + "\t" + file_hex + "\n");
  }
  return "sha256:" + tree.FinalHex();
}

}  // namespace gatehouse
