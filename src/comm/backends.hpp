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
/// `comm_stream`: non-blocking operations on a communication stream of the
/// backend's own (else on the caller's stream, like the blocking ones).
std::unique_ptr<Backend> make_nccl_backend(const Communicator& comm, const char* group,
                                           bool comm_stream);
#endif

} // namespace cubelm::comm::detail
