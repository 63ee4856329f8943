// TempDir: a fresh directory for one test, removed with everything in it on destruction.
//
// std::filesystem::remove_all is safe in binaries that link LibTorch only because every binary
// lists libstdc++ first in DT_NEEDED (top-level CMakeLists.txt, pytorch/pytorch#133437).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <string_view>

namespace gatehouse::test_util {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "gatehouse-test") {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << tmpl << " failed";
      return;
    }
    path_ = std::filesystem::canonical(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace gatehouse::test_util
