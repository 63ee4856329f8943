// How a figure is written into reasons and bar bases: four significant digits.
#pragma once

#include <cstdio>
#include <string>

namespace gatehouse::worker::internal {

/// `v` with four significant digits ("1.234e-06", "0.25").
inline std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

}  // namespace gatehouse::worker::internal
