#pragma once
/// \file
/// \brief The one RAII object that brings MPI and Kokkos up and down in order.

#include <string>
#include <vector>

namespace cubelm {

/// \brief MPI_Init_thread, then Kokkos::initialize; the reverse on destruction.
///
/// Construct exactly one, first thing in main, and keep every communicator,
/// View and file handle inside a scope that ends before it does. In a CUDA
/// build each rank is given GPU (node-local rank mod GPUs per node) unless the
/// command line already names one with --kokkos-device-id. Construction also
/// gathers every rank's node and GPU once (cubelm::world_devices(), core/devices.hpp),
/// from which the comm layer sees which ranks share a GPU.
class Environment {
public:
  /// `threads_call_mpi`: MPI_THREAD_MULTIPLE is asked for (a background checkpoint
  /// writer talks to MPI beside the main thread); else MPI_THREAD_FUNNELED.
  Environment(int& argc, char**& argv, bool threads_call_mpi = false);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  /// \brief Rank in MPI_COMM_WORLD.
  int world_rank() const { return rank_; }
  /// \brief Size of MPI_COMM_WORLD.
  int world_size() const { return size_; }
  /// \brief Thread support MPI granted (MPI_THREAD_* constant).
  int thread_level() const { return thread_level_; }

  /// \brief Collective over MPI_COMM_WORLD: what is wrong with the placement of
  /// the ranks and threads of this rank's node (see core/placement.hpp). The
  /// first rank of each node gets the node's warnings, the others nothing.
  std::vector<std::string> placement_warnings() const;

private:
  bool owns_mpi_ = false;
  bool owns_kokkos_ = false;
  int rank_ = 0;
  int size_ = 1;
  int thread_level_ = 0;
  // The CPUs the launcher gave this process (not the pinned main thread's).
  std::vector<int> launch_cpus_;
};

} // namespace cubelm
