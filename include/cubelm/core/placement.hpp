#pragma once
/// \file
/// \brief Where the ranks of a node and their threads run, and what is wrong
/// with it: more threads than cores, a rank bound to fewer cores than it has
/// threads, or OpenMP pinning the threads of several ranks onto the same cores.
///
/// A wrong placement does not change results, only speed, often by an order of
/// magnitude: four ranks that each start one OpenMP thread per core of the node
/// run 4x more threads than cores and spin against each other. The launcher
/// decides placement; cubelm only reports it (docs/launching.md).

#include <string>
#include <vector>

namespace cubelm {

/// \brief What the launcher gave one rank.
struct RankPlacement {
  int rank = 0;              ///< rank in MPI_COMM_WORLD
  int threads = 1;           ///< host threads Kokkos runs on
  std::vector<int> cpus;     ///< CPUs the process may run on, as the launcher bound it
  bool pins_threads = false; ///< OpenMP binds each thread to a place (OMP_PROC_BIND / OMP_PLACES)
  bool yields = false;       ///< the MPI library yields the core while it waits
};

/// \brief The CPUs this process may run on (its affinity mask), ascending.
std::vector<int> allowed_cpus();

/// \brief The CPUs the launcher gave this process. With thread binding on, the
/// OpenMP runtime pins the initial thread to its first place as the program loads,
/// so the thread's own mask no longer says; OpenMP's places still list every CPU.
std::vector<int> launch_cpus();

/// \brief Gives the calling thread every CPU of launch_cpus() again, undoing the OpenMP
/// runtime's pinning of the initial thread: a program it then executes (execv) starts
/// with the launcher's mask, not with the first place alone. False when the mask could
/// not be set (or no CPU is known).
bool restore_launch_affinity();

/// \brief True when the OpenMP environment asks for thread binding:
/// OMP_PROC_BIND set to anything but "false", or OMP_PLACES set without it.
bool openmp_pins_threads();

/// \brief True when Open MPI is told to yield the core while a rank waits
/// (OMPI_MCA_mpi_yield_when_idle=1/true), instead of busy-polling.
bool mpi_yields_when_idle();

/// \brief "0-3,8,10-11" for a sorted CPU list.
std::string cpu_list(const std::vector<int>& cpus);

/// \brief The warnings for the ranks of one node (empty when the placement is
/// sound). `host` names the node in the messages.
std::vector<std::string> placement_warnings(const std::vector<RankPlacement>& node,
                                            const std::string& host);

} // namespace cubelm
