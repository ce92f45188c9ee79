#pragma once
/// \file
/// \brief A named group of ranks with collectives on Kokkos Views.
///
/// Every operation takes the execution space instance first. Views must be
/// contiguous; their elements are treated as one flat array in memory order.
/// Host-accessible memory goes through MPI. Device memory goes through NCCL
/// when cubelm is built with it and no two members of the group compute on one
/// GPU (shares_device()), otherwise through MPI: directly when GPU-aware MPI is
/// switched on (CommOptions), else staged through a host copy in the group's
/// reused staging buffers (comm/staging.hpp).
/// Each call adds its modelled bytes sent to the group's TrafficCounters.
///
/// isend, irecv, iall_reduce, ireduce_scatter, iall_gather, iall_to_all and
/// iall_to_all_v are the non-blocking twins of send, recv, all_reduce,
/// reduce_scatter, all_gather, all_to_all and all_to_all_v: same arguments,
/// same checks, same traffic accounting (counted when posted), and a Request
/// (comm/request.hpp) that completes them.
/// Each pair is one implementation run in two modes (comm::Mode): the blocking call
/// runs the library's blocking operation (MPI_Allreduce, not MPI_Iallreduce and
/// a wait, whose reduction order may differ) and returns complete. Until
/// it completes, a View being sent must not be written and a View being
/// received must not be read. Non-blocking collectives take the route of their
/// blocking twins, and every rank must post a group's collectives in the same
/// order. With NCCL, blocking calls are enqueued on the execution space's
/// stream and non-blocking ones on the group's communication stream, ordered
/// after the execution space's work by an event (docs/communication.md,
/// "Streams"). isend and irecv always go through MPI, also for device memory
/// when NCCL is on (directly with GPU-aware MPI, else staged through a host
/// copy): NCCL point-to-point calls on one stream cannot keep a send and a
/// receive in flight independently of each other; transfers posted together
/// (comm::Batch) can go through NCCL. So with NCCL on, a device View sent with
/// isend must be received with irecv, and one sent with send with recv.
/// The non-blocking calls are [[nodiscard]]: a Request dropped at once waits
/// in its destructor, which makes the call blocking (and can deadlock a ring).
/// Every blocking library call and every Request::wait is a watchdog::Scope
/// naming the group and the operation (comm/watchdog.hpp).

#include "cubelm/comm/backend.hpp"
#include "cubelm/comm/communicator.hpp"
#include "cubelm/comm/request.hpp"
#include "cubelm/comm/staging.hpp"
#include "cubelm/comm/traffic.hpp"
#include "cubelm/core/compat.hpp"
#include "cubelm/core/devices.hpp"
#include "cubelm/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cubelm::comm {

/// \brief How device memory is moved; read once per process grid (and by default
/// for every Group) from the environment.
struct CommOptions {
  /// Hand device pointers to MPI (only for an MPI library built with CUDA support).
  bool gpu_aware_mpi = false;
  /// Use NCCL for device memory when cubelm was built with it, in every group whose
  /// members are on distinct GPUs (see Group::shares_device).
  bool use_nccl = true;
  /// NCCL: run the non-blocking operations on a communication stream of each group
  /// (overlapping the execution space's kernels), else on the execution space's stream.
  bool comm_stream = true;
  /// Fence the execution space before and after each blocking call on device memory,
  /// so that the communication time of the metrics (comm/wait_time.hpp) is the call's
  /// own on a GPU too; costs the overlap of those calls with computation.
  bool fence_timing = false;
  /// For tests: host memory takes the route of device memory without NCCL or GPU-aware
  /// MPI, through host copies in the group's staging buffers, so that CPU runs check
  /// that route's results and its allocations.
  bool stage_host_memory = false;
  /// For tests: the GPU of every world rank, in place of cubelm::world_devices()
  /// (which Environment gathered); decides which groups share a GPU.
  std::vector<DeviceKey> devices;
  /// \brief Defaults overridden by CUBELM_GPU_AWARE_MPI=1, CUBELM_USE_NCCL=0,
  /// CUBELM_COMM_STREAM=0, CUBELM_FENCE_TIMERS=1 and CUBELM_STAGE_HOST_MEMORY=1.
  static CommOptions from_environment();
};

namespace detail {

struct Posting; // src/comm/posting.cpp: what Group's templates run

/// \brief A contiguous View as the comm layer's compiled code sees it.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0; ///< elements (the View's span)
  DataType type = DataType::u8;
  std::size_t element_bytes = 1;
  bool host = true;     ///< host-accessible memory (else the default device memory space)
  bool writable = true; ///< not a View of const elements
  /// A copy of the View while a non-blocking operation holds it (empty for blocking calls).
  std::shared_ptr<const void> keep;
};

/// \brief `view` as a Buffer, refusing a View that is not contiguous; `keep` holds a copy
/// of the View (its allocation stays alive until the operation completes).
template <class V>
Buffer buffer_of(const V& view, const std::string& group, const char* op, bool keep) {
  static_assert(Kokkos::is_view<V>::value, "cubelm::comm collectives take Kokkos Views");
  using value_type = typename V::value_type;
  using T = std::remove_const_t<value_type>;
  using Space = typename V::memory_space;
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space>::accessible;
  static_assert(host || std::is_same_v<Space, Kokkos::DefaultExecutionSpace::memory_space>,
                "cubelm::comm collectives take host memory or the default device memory space");
  CUBELM_ASSERT(view.span_is_contiguous() && view.span() == view.size(),
                "group '" + group + "' " + op + ": the View '" + view.label() +
                    "' is not contiguous");
  Buffer b;
  b.data = const_cast<T*>(view.data());
  b.count = view.span();
  b.type = data_type_of<T>();
  b.element_bytes = sizeof(T);
  b.host = host;
  b.writable = !std::is_const_v<value_type>;
  if (keep)
    b.keep = std::make_shared<const V>(view);
  return b;
}

/// \brief The execution space instance of a call, as the compiled code sees it: its
/// native stream, a fence, and a copy of bytes within host or device memory ordered on it.
struct ExecRef {
  const void* space = nullptr;
  void* stream = nullptr;
  void (*fence)(const void* space) = nullptr;
  void (*copy)(const void* space, void* dst, const void* src, std::size_t bytes,
               bool host) = nullptr;
};

template <class Exec>
ExecRef exec_ref(const Exec& exec) {
  ExecRef r;
  r.space = &exec;
  r.stream = compat::native_stream(exec);
  r.fence = [](const void* space) { static_cast<const Exec*>(space)->fence(); };
  r.copy = [](const void* space, void* dst, const void* src, std::size_t bytes, bool host) {
    using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
    const Exec& e = *static_cast<const Exec*>(space);
    if (host)
      Kokkos::deep_copy(
          e, Kokkos::View<char*, Kokkos::HostSpace, Unmanaged>(static_cast<char*>(dst), bytes),
          Kokkos::View<const char*, Kokkos::HostSpace, Unmanaged>(static_cast<const char*>(src),
                                                                  bytes));
    else
      Kokkos::deep_copy(
          e,
          Kokkos::View<char*, Kokkos::DefaultExecutionSpace::memory_space, Unmanaged>(
              static_cast<char*>(dst), bytes),
          Kokkos::View<const char*, Kokkos::DefaultExecutionSpace::memory_space, Unmanaged>(
              static_cast<const char*>(src), bytes));
  };
  return r;
}

} // namespace detail

/// \brief A named communicator with collectives on Views and traffic accounting.
class Group {
public:
  /// \brief Host memory through MPI; device memory through NCCL (stream-ordered), or
  /// through MPI on device pointers (GPU-aware MPI) or on a host copy (staged).
  enum class Route { host, nccl, gpu_aware_mpi, staged };

  /// \brief Collective over `comm` (every member constructs it). Decides from the
  /// members' GPUs (options.devices, else cubelm::world_devices()) whether NCCL can
  /// span them; world rank 0 says once per process when ranks share GPUs.
  Group(std::string name, Communicator comm, std::shared_ptr<TrafficCounters> traffic,
        CommOptions options = CommOptions::from_environment());

  const std::string& name() const { return name_; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  const Communicator& communicator() const { return comm_; }
  const TrafficCounters& traffic() const { return *traffic_; }

  /// \brief True when two members of this group compute on one GPU: NCCL refuses
  /// them one communicator, so device memory goes through MPI (docs/communication.md).
  bool shares_device() const { return shares_device_; }
  /// \brief The route of the collectives (and blocking send/recv) on device memory:
  /// Route::nccl when cubelm is built with NCCL, options.use_nccl holds and no two
  /// members share a GPU; else gpu_aware_mpi or staged, as options.gpu_aware_mpi says.
  Route device_collective_route() const { return device_route(true); }
  /// \brief Collective over the group: creates its NCCL communicator now when its
  /// device collectives go through NCCL (else on the first one); nothing otherwise.
  void connect_device() const;
  /// \brief The host buffers of the staged route (tests: they are reused).
  const detail::StagingPool& staging() const { return staging_; }

  /// \brief In-place reduction of `data` over the group.
  template <class Exec, class V>
  void all_reduce(const Exec& exec, const V& data, ReduceOp op = ReduceOp::sum) const {
    post_all_reduce(detail::exec_ref(exec), buffer(data, "all_reduce", Mode::blocking), op,
                    Mode::blocking)
        .wait();
  }

  /// \brief recv = concatenation of every rank's send, in group-rank order.
  template <class Exec, class VS, class VR>
  void all_gather(const Exec& exec, const VS& send, const VR& recv) const {
    check_types<VS, VR>();
    post_all_gather(detail::exec_ref(exec), buffer(send, "all_gather", Mode::blocking),
                    buffer(recv, "all_gather", Mode::blocking), Mode::blocking)
        .wait();
  }

  /// \brief recv = block `rank()` of the elementwise reduction of every rank's send.
  template <class Exec, class VS, class VR>
  void reduce_scatter(const Exec& exec, const VS& send, const VR& recv,
                      ReduceOp op = ReduceOp::sum) const {
    check_types<VS, VR>();
    post_reduce_scatter(detail::exec_ref(exec), buffer(send, "reduce_scatter", Mode::blocking),
                        buffer(recv, "reduce_scatter", Mode::blocking), op, Mode::blocking)
        .wait();
  }

  /// \brief Block j of `send` goes to group rank j, block i of `recv` comes from group
  /// rank i: send and recv hold size() blocks of one length each (equal spans, a
  /// multiple of size()). Counted as the bytes sent to the other ranks.
  template <class Exec, class VS, class VR>
  void all_to_all(const Exec& exec, const VS& send, const VR& recv) const {
    check_types<VS, VR>();
    post_all_to_all(detail::exec_ref(exec), buffer(send, "all_to_all", Mode::blocking),
                    buffer(recv, "all_to_all", Mode::blocking), Mode::blocking)
        .wait();
  }

  /// \brief all_to_all with a block length per peer: the first send_counts[j] elements
  /// after those for ranks 0..j-1 go to group rank j, and recv_counts[i] elements from
  /// group rank i land after those from ranks 0..i-1 (displacements = prefix sums).
  ///
  /// Both count vectors have size() entries (elements, possibly 0) adding up to at most
  /// the span of their View; elements of recv past the received ones are left as they
  /// were. recv_counts[i] must equal send_counts[rank()] of rank i, which no rank can
  /// check locally (MPI reports a longer message as truncated); send_counts[rank()]
  /// must equal recv_counts[rank()]. Counted as the bytes sent to the other ranks.
  template <class Exec, class VS, class VR>
  void all_to_all_v(const Exec& exec, const VS& send, const std::vector<std::size_t>& send_counts,
                    const VR& recv, const std::vector<std::size_t>& recv_counts) const {
    check_types<VS, VR>();
    post_all_to_all_v(detail::exec_ref(exec), buffer(send, "all_to_all_v", Mode::blocking),
                      send_counts, buffer(recv, "all_to_all_v", Mode::blocking), recv_counts,
                      Mode::blocking)
        .wait();
  }

  /// \brief Copies `data` of group rank `root` to every rank.
  template <class Exec, class V>
  void broadcast(const Exec& exec, const V& data, int root) const {
    post_broadcast(detail::exec_ref(exec), buffer(data, "broadcast", Mode::blocking), root);
  }

  /// \brief recv on group rank `root` = reduction of every rank's send; recv is
  /// untouched elsewhere (and may be empty there).
  template <class Exec, class VS, class VR>
  void reduce(const Exec& exec, const VS& send, const VR& recv, int root,
              ReduceOp op = ReduceOp::sum) const {
    static_assert(
        std::is_same_v<typename VS::non_const_value_type, typename VR::non_const_value_type>,
        "reduce: send and recv element types differ");
    post_reduce(detail::exec_ref(exec), buffer(send, "reduce", Mode::blocking),
                buffer(recv, "reduce", Mode::blocking), root, op);
  }

  /// \brief Blocking send of `data` to group rank `peer`.
  template <class Exec, class V>
  void send(const Exec& exec, const V& data, int peer, int tag = 0) const {
    post_p2p(detail::exec_ref(exec), buffer(data, "send", Mode::blocking), peer, tag, Kind::send,
             Mode::blocking)
        .wait();
  }

  /// \brief Blocking receive into `data` from group rank `peer`.
  template <class Exec, class V>
  void recv(const Exec& exec, const V& data, int peer, int tag = 0) const {
    post_p2p(detail::exec_ref(exec), buffer(data, "recv", Mode::blocking), peer, tag, Kind::recv,
             Mode::blocking)
        .wait();
  }

  /// \brief Non-blocking all_reduce: `data` holds the reduction once the Request completes.
  /// A one-rank group returns a complete Request.
  template <class Exec, class V>
  [[nodiscard]] Request iall_reduce(const Exec& exec, const V& data,
                                    ReduceOp op = ReduceOp::sum) const {
    return post_all_reduce(detail::exec_ref(exec), buffer(data, "iall_reduce", Mode::nonblocking),
                           op, Mode::nonblocking);
  }

  /// \brief Non-blocking all_gather (same layout of recv).
  template <class Exec, class VS, class VR>
  [[nodiscard]] Request iall_gather(const Exec& exec, const VS& send, const VR& recv) const {
    check_types<VS, VR>();
    return post_all_gather(detail::exec_ref(exec), buffer(send, "iall_gather", Mode::nonblocking),
                           buffer(recv, "iall_gather", Mode::nonblocking), Mode::nonblocking);
  }

  /// \brief Non-blocking reduce_scatter (recv gets block `rank()`).
  template <class Exec, class VS, class VR>
  [[nodiscard]] Request ireduce_scatter(const Exec& exec, const VS& send, const VR& recv,
                                        ReduceOp op = ReduceOp::sum) const {
    check_types<VS, VR>();
    return post_reduce_scatter(
        detail::exec_ref(exec), buffer(send, "ireduce_scatter", Mode::nonblocking),
        buffer(recv, "ireduce_scatter", Mode::nonblocking), op, Mode::nonblocking);
  }

  /// \brief Non-blocking all_to_all (same layout of send and recv).
  template <class Exec, class VS, class VR>
  [[nodiscard]] Request iall_to_all(const Exec& exec, const VS& send, const VR& recv) const {
    check_types<VS, VR>();
    return post_all_to_all(detail::exec_ref(exec), buffer(send, "iall_to_all", Mode::nonblocking),
                           buffer(recv, "iall_to_all", Mode::nonblocking), Mode::nonblocking);
  }

  /// \brief Non-blocking all_to_all_v; the count vectors are copied when it is posted.
  template <class Exec, class VS, class VR>
  [[nodiscard]] Request iall_to_all_v(const Exec& exec, const VS& send,
                                      const std::vector<std::size_t>& send_counts, const VR& recv,
                                      const std::vector<std::size_t>& recv_counts) const {
    check_types<VS, VR>();
    return post_all_to_all_v(
        detail::exec_ref(exec), buffer(send, "iall_to_all_v", Mode::nonblocking), send_counts,
        buffer(recv, "iall_to_all_v", Mode::nonblocking), recv_counts, Mode::nonblocking);
  }

  /// \brief Non-blocking send of `data` to group rank `peer`, always through MPI
  /// (see the file comment); pair it with irecv.
  template <class Exec, class V>
  [[nodiscard]] Request isend(const Exec& exec, const V& data, int peer, int tag = 0) const {
    return post_p2p(detail::exec_ref(exec), buffer(data, "isend", Mode::nonblocking), peer, tag,
                    Kind::send, Mode::nonblocking);
  }

  /// \brief Non-blocking receive into `data` from group rank `peer`, always through MPI
  /// (see the file comment); pair it with isend.
  template <class Exec, class V>
  [[nodiscard]] Request irecv(const Exec& exec, const V& data, int peer, int tag = 0) const {
    return post_p2p(detail::exec_ref(exec), buffer(data, "irecv", Mode::nonblocking), peer, tag,
                    Kind::recv, Mode::nonblocking);
  }

  /// \brief Waits until every rank of the group arrives.
  void barrier() const;

private:
  friend class Batch; // comm/batch.hpp: point-to-point transfers posted together
  friend struct detail::Posting;

  /// `view` as a Buffer for operation `what`, held until completion when non-blocking.
  template <class V>
  detail::Buffer buffer(const V& view, const char* what, Mode mode) const {
    return detail::buffer_of(view, name_, what, mode == Mode::nonblocking);
  }
  template <class VS, class VR>
  static void check_types() {
    static_assert(
        std::is_same_v<typename VS::non_const_value_type, typename VR::non_const_value_type>,
        "send and recv element types differ");
    static_assert(std::is_same_v<typename VS::memory_space, typename VR::memory_space>,
                  "send and recv live in different memory spaces");
  }

  /// The route of a buffer in host-accessible memory (`host`) or device memory;
  /// `nccl_ok` is false for operations that always go through MPI (non-blocking
  /// point-to-point, see the file comment).
  Route route_for(bool host, bool nccl_ok = true) const;
  Route device_route(bool nccl_ok) const;
  bool stream_ordered_device() const;
  Backend& backend(Route route) const;
  void account(Kind kind, std::size_t message_bytes) const;
  void check_peer(int peer, const char* op) const;
  /// all_gather's recv and reduce_scatter's send (`which`): `elements` = one block per rank.
  void check_blocks(std::size_t elements, std::size_t block, const char* op,
                    const char* which) const;
  /// all_to_all: equal spans of send and recv, `send` elements a multiple of size().
  void check_equal_blocks(std::size_t send, std::size_t recv, const char* op) const;
  /// all_to_all_v: one count per rank, adding up to at most the Views' spans, and the
  /// block a rank keeps as long in send as in recv. Returns the elements sent to others.
  std::size_t check_counts(const std::vector<std::size_t>& send_counts, std::size_t send,
                           const std::vector<std::size_t>& recv_counts, std::size_t recv,
                           const char* op) const;

  // Each operation and its non-blocking twin (group.cpp): checks and traffic
  // accounting once per call, then route, staging and the backend call, in the
  // blocking or the non-blocking mode.
  Request post_all_reduce(const detail::ExecRef& exec, const detail::Buffer& data, ReduceOp op,
                          Mode mode) const;
  Request post_all_gather(const detail::ExecRef& exec, const detail::Buffer& send,
                          const detail::Buffer& recv, Mode mode) const;
  Request post_reduce_scatter(const detail::ExecRef& exec, const detail::Buffer& send,
                              const detail::Buffer& recv, ReduceOp op, Mode mode) const;
  Request post_all_to_all(const detail::ExecRef& exec, const detail::Buffer& send,
                          const detail::Buffer& recv, Mode mode) const;
  Request post_all_to_all_v(const detail::ExecRef& exec, const detail::Buffer& send,
                            const std::vector<std::size_t>& send_counts, const detail::Buffer& recv,
                            const std::vector<std::size_t>& recv_counts, Mode mode) const;
  /// send, recv, isend, irecv (`kind` is Kind::send or Kind::recv). The
  /// non-blocking ones always go through MPI (see the file comment).
  Request post_p2p(const detail::ExecRef& exec, const detail::Buffer& data, int peer, int tag,
                   Kind kind, Mode mode) const;
  void post_broadcast(const detail::ExecRef& exec, const detail::Buffer& data, int root) const;
  void post_reduce(const detail::ExecRef& exec, const detail::Buffer& send,
                   const detail::Buffer& recv, int root, ReduceOp op) const;

  std::string name_;
  const char* watch_name_; // name_, interned for the watchdog
  Communicator comm_;
  std::shared_ptr<TrafficCounters> traffic_;
  CommOptions options_;
  bool shares_device_ = false; // two members on one GPU: no NCCL
  std::shared_ptr<Backend> host_backend_;
  detail::StagingPool staging_; // host copies of the staged route, reused
  // Created by connect_device() (ProcessGrid does it for its groups) or on first use
  // by a collective call on device memory (all ranks of the group make that call, so
  // the lazy NCCL initialisation is collective too).
  mutable std::shared_ptr<Backend> device_backend_;
};

} // namespace cubelm::comm
