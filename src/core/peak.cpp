#include "cubelm/core/peak.hpp"

#include "cubelm/core/mpi_wait.hpp"

#include "cubelm/core/devices.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/placement.hpp"

#include "node.hpp"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace cubelm {

double NodePeak::share() const {
  const double wanted = static_cast<double>(std::max(ranks, 1)) * std::max(threads, 1);
  return std::min(1.0, std::max(cpus, 1) / wanted);
}

NodePeak measure_node_peak(const std::function<double()>& measure, int threads) {
  const NodeComm node; // ordered by world rank
  NodePeak out;
  out.ranks = node.size();
  out.threads = threads;

  // The node's CPUs: the union of what the launcher gave each of its ranks.
  std::vector<unsigned char> mine(CPU_SETSIZE, 0), all(CPU_SETSIZE, 0);
  for (const int c : launch_cpus())
    if (c >= 0 && c < CPU_SETSIZE)
      mine[static_cast<std::size_t>(c)] = 1;
  CUBELM_MPI_CHECK(
      MPI_Allreduce(mine.data(), all.data(), CPU_SETSIZE, MPI_UNSIGNED_CHAR, MPI_BOR, node.raw()));
  out.cpus = static_cast<int>(std::count(all.begin(), all.end(), 1));
  // A device build shares GPUs, not CPUs: the node's distinct GPUs over its ranks.
  int world_rank = 0;
  CUBELM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  const auto& devices = world_devices();
  if (static_cast<std::size_t>(world_rank) < devices.size() &&
      !devices[static_cast<std::size_t>(world_rank)].device.empty()) {
    const int my_node = devices[static_cast<std::size_t>(world_rank)].node;
    std::set<std::string> gpus;
    for (const DeviceKey& d : devices)
      if (d.node == my_node)
        gpus.insert(d.device);
    out.cpus = static_cast<int>(gpus.size());
    out.threads = 1;
  }

  if (node.rank() == 0)
    out.alone = measure();
  // The ranks that wait leave the cores to the rank that measures.
  std::vector<MPI_Request> request(1);
  CUBELM_MPI_CHECK(MPI_Ibcast(&out.alone, 1, MPI_DOUBLE, 0, node.raw(), request.data()));
  wait_all(request, node.rank() != 0);
  return out;
}

} // namespace cubelm
