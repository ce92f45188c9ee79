#pragma once
/// \file
/// \brief RAII wrapper of an MPI communicator.

#include <mpi.h>

#include <memory>
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

} // namespace cubelm::comm
