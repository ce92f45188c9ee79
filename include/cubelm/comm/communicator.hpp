#pragma once
/// \file
/// \brief RAII wrapper of an MPI communicator.

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

namespace cubelm::comm {

/// \brief Owns a duplicated MPI communicator; MPI_Comm_free runs when the last copy goes.
///
/// Copies share the communicator (std::shared_ptr with an MPI_Comm_free deleter),
/// so a Communicator can be stored in several groups without double frees.
class Communicator {
public:
  /// \brief A null communicator (size 0).
  Communicator() = default;

  /// \brief A private duplicate of MPI_COMM_WORLD.
  static Communicator world();
  /// \brief A private duplicate of `comm` (which stays owned by the caller).
  static Communicator duplicate(MPI_Comm comm);

  /// \brief MPI_Comm_split: ranks with equal `color` form one communicator, ordered by `key`.
  Communicator split(int color, int key) const;

  /// \brief The MPI_COMM_WORLD rank of each member, in this communicator's rank order
  /// (-1 for a member outside MPI_COMM_WORLD). Not collective.
  std::vector<int> world_ranks() const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// \brief The raw handle, for the comm layer's backends only.
  MPI_Comm raw() const { return comm_ ? *comm_ : MPI_COMM_NULL; }
  explicit operator bool() const { return static_cast<bool>(comm_); }

private:
  explicit Communicator(MPI_Comm owned);

  std::shared_ptr<MPI_Comm> comm_;
  int rank_ = 0;
  int size_ = 0;
};

/// \brief True when MPI runs at MPI_THREAD_MULTIPLE: a second thread may talk to MPI
/// (on a communicator of its own) while the main thread does.
bool threads_may_call_mpi();

/// \brief Collective over `comm`: every rank passes its own complaint ("" for none) and
/// gets back the complaint of the lowest rank that has one, so that every rank can
/// throw the same exception and none is left waiting in the next collective call.
std::string agree(const Communicator& comm, const std::string& local);

/// \brief Why a second thread must not talk to MPI beside the main thread in this run,
/// or "" when it may: MPI runs below MPI_THREAD_MULTIPLE, or it is an MPI known to hang
/// then (mpi_thread_hazard). Collective over `comm`: every rank gets the same answer
/// (the lowest rank's reason, when any rank has one).
std::string second_thread_problem(const Communicator& comm);

/// \brief The MPI library's own description of itself (MPI_Get_library_version).
std::string mpi_library();

/// \brief The rule for MPIs known to hang when two threads communicate at once, given
/// `library` as MPI_Get_library_version writes it: the reason, or "".
///
/// Open MPI 6.0.0 release candidates (measured: v6.0.0rc2). With a thread of each process
/// writing through parallel HDF5 on a communicator of its own while the main thread
/// communicates on others, ranks wait forever: through the shared-memory transport in a
/// program of MPI and HDF5 alone, and through TCP in cubelm's background-save test,
/// every writer stopped inside HDF5's collective write (docs/training.md).
std::string mpi_thread_hazard(const std::string& library);

} // namespace cubelm::comm
