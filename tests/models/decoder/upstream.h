// Upstream answers for the decoder's per-source tests: runs tests/models/decoder/upstream.py
// (transformers, in the project venv at GATEHOUSE_PYTHON) on a batch of cases, and moves
// tensors to and from its JSON form ({"shape", "values"} of fp32 numbers).
//
// Header-only; the test target defines GATEHOUSE_PYTHON and GATEHOUSE_UPSTREAM_SCRIPT
// (tests/models/CMakeLists.txt).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"

#ifndef GATEHOUSE_PYTHON
#error "GATEHOUSE_PYTHON must be defined by the test target"
#endif
#ifndef GATEHOUSE_UPSTREAM_SCRIPT
#error "GATEHOUSE_UPSTREAM_SCRIPT must be defined by the test target"
#endif

namespace gatehouse::test_util {

/// A tensor as upstream.py reads it: fp32 values, row-major, with the shape.
inline nlohmann::json TensorJson(const torch::Tensor& t) {
  auto flat = t.detach().to(torch::kCPU, torch::kFloat32).contiguous().reshape({-1});
  std::vector<float> values(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
  return {{"shape", t.sizes().vec()}, {"values", values}};
}

/// The fp32 tensor a {"shape", "values"} object holds.
inline torch::Tensor TensorFromJson(const nlohmann::json& j) {
  const auto values = j.at("values").get<std::vector<float>>();
  return torch::tensor(values, torch::kFloat32).reshape(j.at("shape").get<std::vector<int64_t>>());
}

/// Runs `upstream.py command` on {"cases": cases} and returns its "results" (one per case).
/// A failed run fails the calling test with the script's stderr and returns an empty array.
inline nlohmann::json RunUpstream(const std::string& command, const nlohmann::json& cases) {
  TempDir dir("gatehouse-upstream");
  const auto in = dir.path() / "in.json", out = dir.path() / "out.json",
             err = dir.path() / "stderr.txt";
  std::ofstream(in) << nlohmann::json{{"cases", cases}}.dump();
  auto quoted = [](const std::string& s) { return "'" + s + "'"; };
  const std::string cmd = quoted(GATEHOUSE_PYTHON) + " " + quoted(GATEHOUSE_UPSTREAM_SCRIPT) +
                          " " + command + " " + quoted(in.string()) + " " +
                          quoted(out.string()) + " >/dev/null 2>" + quoted(err.string());
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::stringstream text;
    text << std::ifstream(err).rdbuf();
    ADD_FAILURE() << "upstream.py " << command << " exited with " << rc << ":\n" << text.str();
    return nlohmann::json::array();
  }
  auto results = nlohmann::json::parse(std::ifstream(out), nullptr, false);
  if (results.is_discarded() || !results.contains("results")) {
    ADD_FAILURE() << "upstream.py " << command << " wrote no results";
    return nlohmann::json::array();
  }
  return results["results"];
}

}  // namespace gatehouse::test_util
