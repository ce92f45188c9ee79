#pragma once
/// \file
/// \brief Which GPU each rank computes on, gathered once at start-up, and what
/// the GPU runtime of this build sees.
///
/// Kokkos-free and MPI-free: Environment fills the table, the comm layer reads
/// it to keep NCCL away from groups whose members share a GPU
/// (comm/devices.hpp, docs/communication.md).

#include <string>
#include <vector>

namespace cubelm {

/// \brief A rank's GPU as NCCL tells GPUs apart: its node and its PCI bus id.
struct DeviceKey {
  /// The node: the world rank of its first rank (ranks that share memory,
  /// MPI_COMM_TYPE_SHARED); -1 when unknown.
  int node = -1;
  /// The node's host name, for messages.
  std::string node_name;
  /// The GPU's PCI bus id ("0000:1B:00.0"); empty when the rank has no GPU (CPU builds).
  std::string device;
  /// The CUDA device number the rank uses (as its own CUDA_VISIBLE_DEVICES numbers
  /// them), for messages; -1 without a GPU.
  int ordinal = -1;
};

/// \brief The device of every world rank, indexed by world rank, as Environment
/// gathered it at start-up (one MPI_Allgather); empty when no Environment was
/// constructed. Ranks of a CPU build have an empty `device`.
const std::vector<DeviceKey>& world_devices();

/// \brief The devices a CUDA build can use: their count, or 0 with the
/// runtime's reason (no driver, no device, driver too old) in `why`. A host
/// build has none and says so. Needs neither MPI nor Kokkos to be initialised.
int usable_devices(std::string* why = nullptr);

/// \brief One line for `cubelm --version` and run summaries: the CUDA runtime
/// and driver API versions and each device (name, compute capability, memory),
/// or why there is none. Needs neither MPI nor Kokkos to be initialised.
std::string device_summary();

} // namespace cubelm
