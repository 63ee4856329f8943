#include "cli/matrix.h"

#include <array>
#include <string>
#include <string_view>

namespace gatehouse::cli {
namespace {

using nlohmann::json;

struct Axis {
  std::string_view member;  // in the matrix file
  std::string_view field;   // in the submit body ("" for checkpoints: two fields)
};

/// In expansion order; the last varies fastest.
constexpr std::array<Axis, 7> kAxes = {{{"repository", "repository"},
                                        {"branch", "branch"},
                                        {"checkpoints", ""},
                                        {"precision", "precision"},
                                        {"topology", "topology"},
                                        {"mode", "mode"},
                                        {"device", "device"}}};

Status MatrixError(std::string_view member, std::string_view what) {
  return Status::InvalidArgument("matrix member '" + std::string(member) + "': " +
                                 std::string(what));
}

/// An axis's values: the list, or the one value. Topology is an object, so a list of
/// objects is a list of topologies and one object is one topology.
Result<std::vector<json>> Values(const json& v, std::string_view member) {
  if (!v.is_array()) return std::vector<json>{v};
  if (v.empty()) return MatrixError(member, "an empty list gives no cell");
  return std::vector<json>(v.begin(), v.end());
}

/// Applies one checkpoints item to `body`.
Status ApplyCheckpoint(const json& item, size_t index, json& body) {
  const std::string where = "checkpoints[" + std::to_string(index) + "]";
  if (item.is_string()) {
    body["checkpoint"] = item;
    return Status::Ok();
  }
  if (!item.is_object() || !item.contains("checkpoint")) {
    return MatrixError(where, "expected a checkpoint path or {\"checkpoint\", \"reference\"}");
  }
  for (const auto& [key, value] : item.items()) {
    if (key != "checkpoint" && key != "reference") {
      return MatrixError(where + "." + key, "unknown (expected checkpoint, reference)");
    }
    body[key] = value;
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<json>> ExpandMatrix(const json& matrix) {
  if (!matrix.is_object()) return Status::InvalidArgument("a matrix file holds a JSON object");
  for (const auto& [key, value] : matrix.items()) {
    bool known = key == "base";
    for (const Axis& a : kAxes) known |= key == a.member;
    if (!known) {
      return MatrixError(key, "unknown (axes: repository, branch, checkpoints, precision, "
                              "topology, mode, device; shared members go in 'base')");
    }
  }
  json base = matrix.value("base", json::object());
  if (!base.is_object()) return MatrixError("base", "expected an object of submit members");
  for (const Axis& a : kAxes) {
    const bool in_base = a.field.empty() ? base.contains("checkpoint") || base.contains("reference")
                                         : base.contains(std::string(a.field));
    if (matrix.contains(std::string(a.member)) && in_base) {
      return MatrixError(a.member, a.field.empty()
                                       ? "an axis while 'base' sets checkpoint or reference"
                                       : "given both as an axis and in 'base'");
    }
  }

  std::vector<json> bodies = {base};
  for (const Axis& a : kAxes) {
    auto it = matrix.find(std::string(a.member));
    if (it == matrix.end()) continue;
    GH_ASSIGN_OR_RETURN(std::vector<json> values, Values(*it, a.member));
    if (bodies.size() * values.size() > kMaxMatrixCells) {
      return Status::InvalidArgument(
          "the matrix expands to " + std::to_string(bodies.size() * values.size()) +
          " cells by axis '" + std::string(a.member) + "' (with the axes before it); at most " +
          std::to_string(kMaxMatrixCells));
    }
    std::vector<json> next;
    for (const json& body : bodies) {
      for (size_t i = 0; i < values.size(); ++i) {
        json b = body;
        if (a.field.empty()) {
          GH_RETURN_IF_ERROR(ApplyCheckpoint(values[i], i, b));
        } else {
          b[std::string(a.field)] = values[i];
        }
        next.push_back(std::move(b));
      }
    }
    bodies = std::move(next);
  }
  return bodies;
}

}  // namespace gatehouse::cli
