#pragma once
// Concrete collective backends; only the comm layer constructs them.

#include "cubelm/comm/backend.hpp"
#include "cubelm/comm/communicator.hpp"

#include <memory>

namespace cubelm::comm::detail {

/// MPI on host memory, or on device memory when the MPI library is GPU-aware.
std::unique_ptr<Backend> make_mpi_backend(const Communicator& comm);

#ifdef CUBELM_ENABLE_NCCL
/// NCCL on device memory; the unique id travels over `comm` (collective call).
/// `group` (a watchdog::intern()ed name) names the group to the hang watchdog.
std::unique_ptr<Backend> make_nccl_backend(const Communicator& comm, const char* group);
#endif

} // namespace cubelm::comm::detail
