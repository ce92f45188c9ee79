#include "cubelm/comm/group.hpp"

#include "cubelm/comm/devices.hpp"
#include "cubelm/comm/watchdog.hpp"

#include "backends.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cubelm::comm {

namespace {
bool env_flag(const char* name, bool fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0')
    return fallback;
  return !(std::strcmp(value, "0") == 0 || std::strcmp(value, "false") == 0 ||
           std::strcmp(value, "no") == 0 || std::strcmp(value, "off") == 0);
}

// The GPU of each member of `comm` (an unknown one for a rank that `devices` does not
// list: it shares no GPU).
std::vector<DeviceKey> member_devices(const Communicator& comm,
                                      const std::vector<DeviceKey>& devices) {
  std::vector<DeviceKey> members;
  for (const int r : comm.world_ranks())
    members.push_back(r >= 0 && static_cast<std::size_t>(r) < devices.size()
                          ? devices[static_cast<std::size_t>(r)]
                          : DeviceKey());
  return members;
}

// Once per process, on world rank 0 and only where it changes a route: which ranks
// share GPUs, so that groups spanning them leave NCCL for MPI.
void report_shared_devices(const std::vector<DeviceKey>& devices, const CommOptions& options) {
#ifdef CUBELM_ENABLE_NCCL
  static std::atomic<bool> said{false};
  if (!options.use_nccl || said.load())
    return;
  int world_rank = 0;
  CUBELM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  if (world_rank != 0)
    return;
  const std::vector<SharedDevice> shared = shared_devices(devices);
  if (shared.empty() || said.exchange(true))
    return;
  std::fprintf(stderr, "%s\n", describe_shared_devices(shared, options.gpu_aware_mpi).c_str());
  std::fflush(stderr);
#else
  (void)devices, (void)options; // no NCCL: no route changes
#endif
}

} // namespace

CommOptions CommOptions::from_environment() {
  CommOptions options;
  options.gpu_aware_mpi = env_flag("CUBELM_GPU_AWARE_MPI", options.gpu_aware_mpi);
  options.use_nccl = env_flag("CUBELM_USE_NCCL", options.use_nccl);
  options.comm_stream = env_flag("CUBELM_COMM_STREAM", options.comm_stream);
  options.fence_timing = env_flag("CUBELM_FENCE_TIMERS", options.fence_timing);
  options.stage_host_memory = env_flag("CUBELM_STAGE_HOST_MEMORY", options.stage_host_memory);
  return options;
}

Group::Group(std::string name, Communicator comm, std::shared_ptr<TrafficCounters> traffic,
             CommOptions options)
    : name_(std::move(name)), watch_name_(watchdog::intern(name_)), comm_(std::move(comm)),
      traffic_(std::move(traffic)), options_(options),
      host_backend_(detail::make_mpi_backend(comm_)) {
  CUBELM_ASSERT(comm_, "group '" + name_ + "' needs a communicator");
  CUBELM_ASSERT(traffic_, "group '" + name_ + "' needs traffic counters");
  // Every member reads the same table of the world's GPUs, so all of them take the
  // same route, before any device collective.
  const std::vector<DeviceKey>& devices =
      options_.devices.empty() ? world_devices() : options_.devices;
  if (!options_.devices.empty()) {
    int world_size = 0;
    CUBELM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    CUBELM_ASSERT(options_.devices.size() == static_cast<std::size_t>(world_size),
                  "group '" + name_ + "': CommOptions::devices lists " +
                      std::to_string(options_.devices.size()) + " ranks, the world has " +
                      std::to_string(world_size));
  }
  shares_device_ = !shared_devices(member_devices(comm_, devices)).empty();
  report_shared_devices(devices, options_);
}

bool Group::stream_ordered_device() const {
#ifdef CUBELM_ENABLE_NCCL
  return options_.use_nccl && !shares_device_;
#else
  return false;
#endif
}

void Group::connect_device() const {
  if (size() > 1 && device_route(true) == Route::nccl) {
    const watchdog::Scope waiting(watch_name_, "connect");
    (void)backend(Route::nccl);
  }
}

Group::Route Group::device_route(bool nccl_ok) const {
  if (nccl_ok && stream_ordered_device())
    return Route::nccl;
  return options_.gpu_aware_mpi ? Route::gpu_aware_mpi : Route::staged;
}

Backend& Group::backend(Route route) const {
  if (route != Route::nccl)
    return *host_backend_; // MPI: host memory, host copies, or GPU-aware device pointers
#ifdef CUBELM_ENABLE_NCCL
  if (!device_backend_)
    device_backend_ = detail::make_nccl_backend(comm_, watch_name_, options_.comm_stream);
  return *device_backend_;
#else
  return *host_backend_;
#endif
}

void Group::account(Kind kind, std::size_t message_bytes) const {
  traffic_->add(name_, kind, modeled_bytes_sent(kind, size(), static_cast<double>(message_bytes)));
}

void Group::check_peer(int peer, const char* op) const {
  CUBELM_ASSERT(peer >= 0 && peer < size(), "group '" + name_ + "' " + op + ": rank " +
                                                std::to_string(peer) + " is outside 0.." +
                                                std::to_string(size() - 1));
}

void Group::check_blocks(std::size_t elements, std::size_t block, const char* op,
                         const char* which) const {
  CUBELM_ASSERT(elements == block * static_cast<std::size_t>(size()),
                "group '" + name_ + "' " + op + ": " + which + " has " + std::to_string(elements) +
                    " elements, expected " + std::to_string(size()) + " x " +
                    std::to_string(block));
}

void Group::check_equal_blocks(std::size_t send, std::size_t recv, const char* op) const {
  const auto p = static_cast<std::size_t>(size());
  CUBELM_ASSERT(send % p == 0, "group '" + name_ + "' " + op + ": send has " +
                                   std::to_string(send) +
                                   " elements, not a multiple of the group size " +
                                   std::to_string(p) + " (one equal block per rank)");
  CUBELM_ASSERT(recv == send, "group '" + name_ + "' " + op + ": recv has " + std::to_string(recv) +
                                  " elements, expected " + std::to_string(send) +
                                  " (as many as send)");
}

std::size_t Group::check_counts(const std::vector<std::size_t>& send_counts, std::size_t send,
                                const std::vector<std::size_t>& recv_counts, std::size_t recv,
                                const char* op) const {
  const auto p = static_cast<std::size_t>(size());
  const std::string where = "group '" + name_ + "' " + op + ": ";
  std::size_t sums[2] = {0, 0};
  const std::vector<std::size_t>* counts[2] = {&send_counts, &recv_counts};
  const std::size_t spans[2] = {send, recv};
  const char* names[2] = {"send", "recv"};
  for (int k = 0; k < 2; ++k) {
    CUBELM_ASSERT(counts[k]->size() == p,
                  where + names[k] + "_counts has " + std::to_string(counts[k]->size()) +
                      " entries, expected one per rank of the group (" + std::to_string(p) + ")");
    for (const std::size_t c : *counts[k])
      sums[k] += c;
    CUBELM_ASSERT(sums[k] <= spans[k], where + names[k] + "_counts add up to " +
                                           std::to_string(sums[k]) + " elements, more than the " +
                                           std::to_string(spans[k]) + " of " + names[k]);
  }
  const auto me = static_cast<std::size_t>(rank());
  CUBELM_ASSERT(send_counts[me] == recv_counts[me],
                where + "rank " + std::to_string(me) + " sends itself " +
                    std::to_string(send_counts[me]) + " elements (send_counts[" +
                    std::to_string(me) + "]) but receives " + std::to_string(recv_counts[me]) +
                    " (recv_counts[" + std::to_string(me) + "])");
  return sums[0] - send_counts[me];
}

void Group::barrier() const {
  const watchdog::Scope waiting(watch_name_, "barrier");
  host_backend_->barrier();
}

} // namespace cubelm::comm
