// A deliberate error: pipeline/ is Kokkos-free, and its sources may include core/ only.
#include "cubelm/comm/group.hpp"
