#pragma once
/// \file
/// \brief Memory admission: before a run allocates, every rank compares the bytes
/// its part of the model needs with the memory it may take, and all ranks agree
/// on the outcome (one collective decision, so a refusal ends the job cleanly).
/// docs/reliability.md#memory-admission.

#include <cstdint>
#include <string>

namespace cubelm {

/// \brief Share of the available memory kept for what the estimate does not count
/// (the token corpus, Kokkos, MPI and allocator overheads).
constexpr double kMemoryReserve = 0.10;

/// \brief The environment variable that skips the check ("1" on any rank skips it on all).
constexpr const char* kSkipMemoryCheck = "CUBELM_SKIP_MEMORY_CHECK";

/// \brief The outcome of check_memory, the same on every rank.
struct MemoryCheck {
  bool skipped = false;        ///< CUBELM_SKIP_MEMORY_CHECK=1 on some rank: nothing was compared
  bool fits = true;            ///< every rank's need <= its usable memory
  int rank = 0;                ///< the world rank with the least room (largest need / usable)
  std::uint64_t need = 0;      ///< that rank's need, bytes
  std::uint64_t available = 0; ///< memory available to that rank, bytes
  std::uint64_t usable = 0;    ///< available less the reserve: what the need is compared with
  int sharing = 1;             ///< ranks that share the node's (or the GPU's) memory with it
  std::string source; ///< where `available` came from, e.g. "host memory (MemAvailable 22.7 GiB)"
};

/// \brief available * (1 - kMemoryReserve).
std::uint64_t usable_memory(std::uint64_t available);

/// \brief Collective over MPI_COMM_WORLD. Each rank passes the bytes it will
/// allocate; it reads the memory it may take (host build: min of MemAvailable and
/// its cgroup's headroom, divided among the node's ranks; CUDA build: the free
/// memory of its GPU, divided among the node's ranks on that GPU), and the ranks
/// agree on the rank with the least room.
MemoryCheck check_memory(std::uint64_t need);

} // namespace cubelm
