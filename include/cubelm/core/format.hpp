#pragma once
/// \file
/// \brief Numbers for people: one rule for every count and rate cubelm prints.

#include <cmath>
#include <cstdio>
#include <string>

namespace cubelm {

/// \brief `x` with an SI prefix (k, M, G, T, P) and `decimals` decimals, no space:
/// si(57600, 1) = "57.6k", si(1.234e6, 2) = "1.23M". Below 1000 no prefix, and a whole
/// number has no decimals: si(512, 2) = "512", si(999.04, 1) = "999.0".
inline std::string si(double x, int decimals) {
  const char* prefix[] = {"", "k", "M", "G", "T", "P"};
  int p = 0;
  while (std::fabs(x) >= 1000.0 && p < 5) {
    x /= 1000.0;
    ++p;
  }
  const int digits = p == 0 && x == std::floor(x) ? 0 : decimals;
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*f%s", digits, x, prefix[p]);
  return buf;
}

} // namespace cubelm
