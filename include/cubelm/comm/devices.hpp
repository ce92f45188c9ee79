#pragma once
/// \file
/// \brief Which members of a group share a GPU, and the line that says so.
///
/// NCCL refuses a communicator with two ranks on one GPU ("Duplicate GPU
/// detected", ncclInvalidUsage). A group whose members include such ranks moves
/// device memory through MPI instead (docs/communication.md, "Ranks that share a
/// GPU"); these functions decide it. Kokkos-free and MPI-free.

#include "cubelm/core/devices.hpp"

#include <string>
#include <vector>

namespace cubelm::comm {

/// \brief One GPU used by several of the ranks given.
struct SharedDevice {
  int node = -1;          ///< DeviceKey::node
  std::string node_name;  ///< DeviceKey::node_name of the first rank
  std::string device;     ///< the PCI bus id
  int ordinal = -1;       ///< the first rank's device number
  std::vector<int> ranks; ///< indices into the ranks given, ascending (two or more)
};

/// \brief Every GPU that two or more of `ranks` use (same node, same device),
/// ordered by their first rank; empty when all use distinct GPUs or have none.
/// Ranks without a GPU (empty `device`) never share one.
std::vector<SharedDevice> shared_devices(const std::vector<DeviceKey>& ranks);

/// \brief The one line that says which world ranks share GPUs and what it changes,
/// e.g. "cubelm: 2 ranks share a GPU on node gpu01 (ranks 0,1 on GPU 0): groups
/// spanning them use MPI through host memory instead of NCCL"; `shared` is
/// shared_devices() of the world, `gpu_aware_mpi` names MPI's route for device
/// memory. At most four GPUs are listed. Empty when `shared` is.
std::string describe_shared_devices(const std::vector<SharedDevice>& shared, bool gpu_aware_mpi);

} // namespace cubelm::comm
