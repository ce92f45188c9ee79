#pragma once
/// \file
/// \brief The peak a rank's MFU is measured against: a rate measured on each node
/// with no other rank of the node running, times this rank's share of the node's
/// CPUs. MFU is the model's FLOP rate over that peak (docs/launching.md#mfu).

#include <functional>

namespace cubelm {

/// \brief A node's measured rate and this rank's share of it.
struct NodePeak {
  double alone = 0; ///< what `measure` returned on the node's first rank, the others idle
  int ranks = 1;    ///< ranks on this node
  int cpus = 1;     ///< CPUs the launcher gave the node's ranks (their union);
                    ///< in a device build the node's distinct GPUs
  int threads = 1;  ///< host threads of this rank; 1 in a device build
  /// \brief min(1, cpus / (ranks x threads)): below 1 when the ranks' threads
  /// outnumber the CPUs and take turns on them.
  double share() const;
  /// \brief alone x share(): the rank's peak.
  double per_rank() const { return alone * share(); }
};

/// \brief Collective over MPI_COMM_WORLD: the first rank of each node runs `measure`
/// (a rate with this rank's `threads`) while the node's other ranks wait without
/// spinning; every rank of the node gets the result, the node's rank count and the
/// union of its ranks' CPUs.
NodePeak measure_node_peak(const std::function<double()>& measure, int threads);

} // namespace cubelm
