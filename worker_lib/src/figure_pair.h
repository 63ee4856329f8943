// Two figures side by side in a FAIL reason, written so that their difference shows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace gatehouse::worker::internal {

/// "<ours> vs <theirs>" with as many significant digits as it takes for the two to print
/// differently when they differ (four at least, 17 at most: a double's round-trip width), so a
/// relative difference of 4.7e-8 reads "0.0634123412 vs 0.0634123442", not "0.06341 vs 0.06341".
inline std::string NumVs(double ours, double theirs, const char* vs = " vs ") {
  char a[40], b[40];
  for (int digits = 4; digits <= 17; ++digits) {
    std::snprintf(a, sizeof(a), "%.*g", digits, ours);
    std::snprintf(b, sizeof(b), "%.*g", digits, theirs);
    if (std::string(a) != b || ours == theirs || !std::isfinite(ours) || !std::isfinite(theirs)) {
      break;
    }
  }
  return std::string(a) + vs + b;
}

}  // namespace gatehouse::worker::internal
