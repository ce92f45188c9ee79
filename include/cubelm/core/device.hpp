#pragma once
/// \file
/// \brief What the GPU runtime of this build sees, asked without Kokkos or MPI.

#include <string>

namespace cubelm {

/// \brief The devices a CUDA build can use: their count, or 0 with the
/// runtime's reason (no driver, no device, driver too old) in `why`. A host
/// build has none and says so.
int usable_devices(std::string* why = nullptr);

/// \brief One line for `cubelm --version` and run summaries: the CUDA runtime
/// and driver API versions and each device (name, compute capability, memory),
/// or why there is none. Needs neither MPI nor Kokkos to be initialised.
std::string device_summary();

} // namespace cubelm
