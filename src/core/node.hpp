#pragma once
// The ranks of this process's node, the ones that share its memory (and its
// GPUs): MPI_COMM_TYPE_SHARED of the world, freed when it goes out of scope.
// Internal to src/core.

#include "cubelm/core/error.hpp"

#include <mpi.h>

namespace cubelm {

class NodeComm {
public:
  /// \brief Ranks ordered by `key` (ties: by world rank).
  explicit NodeComm(int key = 0) {
    CUBELM_MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &comm_));
    CUBELM_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    CUBELM_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~NodeComm() { MPI_Comm_free(&comm_); }
  NodeComm(const NodeComm&) = delete;
  NodeComm& operator=(const NodeComm&) = delete;

  MPI_Comm raw() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

} // namespace cubelm
