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
#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/compat.hpp"
#include "cubelm/core/devices.hpp"
#include "cubelm/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <memory>
#include <string>
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

template <class V>
void require_contiguous(const V& view, const std::string& group, const char* op) {
  static_assert(Kokkos::is_view<V>::value, "cubelm::comm collectives take Kokkos Views");
  CUBELM_ASSERT(view.span_is_contiguous() && view.span() == view.size(),
                "group '" + group + "' " + op + ": the View '" + view.label() +
                    "' is not contiguous");
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
    post_all_reduce(exec, data, op, Mode::blocking).wait();
  }

  /// \brief recv = concatenation of every rank's send, in group-rank order.
  template <class Exec, class VS, class VR>
  void all_gather(const Exec& exec, const VS& send, const VR& recv) const {
    post_all_gather(exec, send, recv, Mode::blocking).wait();
  }

  /// \brief recv = block `rank()` of the elementwise reduction of every rank's send.
  template <class Exec, class VS, class VR>
  void reduce_scatter(const Exec& exec, const VS& send, const VR& recv,
                      ReduceOp op = ReduceOp::sum) const {
    post_reduce_scatter(exec, send, recv, op, Mode::blocking).wait();
  }

  /// \brief Block j of `send` goes to group rank j, block i of `recv` comes from group
  /// rank i: send and recv hold size() blocks of one length each (equal spans, a
  /// multiple of size()). Counted as the bytes sent to the other ranks.
  template <class Exec, class VS, class VR>
  void all_to_all(const Exec& exec, const VS& send, const VR& recv) const {
    post_all_to_all(exec, send, recv, Mode::blocking).wait();
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
    post_all_to_all_v(exec, send, send_counts, recv, recv_counts, Mode::blocking).wait();
  }

  /// \brief Copies `data` of group rank `root` to every rank.
  template <class Exec, class V>
  void broadcast(const Exec& exec, const V& data, int root) const {
    detail::require_contiguous(data, name_, "broadcast");
    check_peer(root, "broadcast");
    using T = typename V::non_const_value_type;
    const std::size_t n = data.span();
    account(Kind::broadcast, n * sizeof(T));
    if (size() == 1)
      return;
    post_one(exec, data, route_for<V>(), rank() == root, true, "broadcast",
             [&](Backend& b, void* buf, void* stream) {
               b.broadcast(buf, n, data_type_of<T>(), root, stream);
               return std::unique_ptr<PendingOp>();
             });
  }

  /// \brief recv on group rank `root` = reduction of every rank's send; recv is
  /// untouched elsewhere (and may be empty there).
  template <class Exec, class VS, class VR>
  void reduce(const Exec& exec, const VS& send, const VR& recv, int root,
              ReduceOp op = ReduceOp::sum) const {
    detail::require_contiguous(send, name_, "reduce");
    detail::require_contiguous(recv, name_, "reduce");
    check_peer(root, "reduce");
    using T = typename VR::non_const_value_type;
    static_assert(std::is_same_v<typename VS::non_const_value_type, T>,
                  "reduce: send and recv element types differ");
    const std::size_t n = send.span();
    if (rank() == root)
      CUBELM_ASSERT(recv.span() == n, "group '" + name_ + "' reduce: recv on the root has " +
                                          std::to_string(recv.span()) + " elements, expected " +
                                          std::to_string(n));
    account(Kind::reduce, n * sizeof(T));
    post_pair(exec, send, recv, rank() == root, Mode::blocking, "reduce",
              [&](Backend& b, void* s, void* r, void* stream) {
                b.reduce(s, r, n, data_type_of<T>(), op, root, stream);
                return std::unique_ptr<PendingOp>();
              });
  }

  /// \brief Blocking send of `data` to group rank `peer`.
  template <class Exec, class V>
  void send(const Exec& exec, const V& data, int peer, int tag = 0) const {
    post_p2p(exec, data, peer, tag, Kind::send, Mode::blocking).wait();
  }

  /// \brief Blocking receive into `data` from group rank `peer`.
  template <class Exec, class V>
  void recv(const Exec& exec, const V& data, int peer, int tag = 0) const {
    post_p2p(exec, data, peer, tag, Kind::recv, Mode::blocking).wait();
  }

  /// \brief Non-blocking all_reduce: `data` holds the reduction once the Request completes.
  /// A one-rank group returns a complete Request.
  template <class Exec, class V>
  [[nodiscard]] Request iall_reduce(const Exec& exec, const V& data,
                                    ReduceOp op = ReduceOp::sum) const {
    return post_all_reduce(exec, data, op, Mode::nonblocking);
  }

  /// \brief Non-blocking all_gather (same layout of recv).
  template <class Exec, class VS, class VR>
  [[nodiscard]] Request iall_gather(const Exec& exec, const VS& send, const VR& recv) const {
    return post_all_gather(exec, send, recv, Mode::nonblocking);
  }

  /// \brief Non-blocking reduce_scatter (recv gets block `rank()`).
  template <class Exec, class VS, class VR>
  [[nodiscard]] Request ireduce_scatter(const Exec& exec, const VS& send, const VR& recv,
                                        ReduceOp op = ReduceOp::sum) const {
    return post_reduce_scatter(exec, send, recv, op, Mode::nonblocking);
  }

  /// \brief Non-blocking all_to_all (same layout of send and recv).
  template <class Exec, class VS, class VR>
  [[nodiscard]] Request iall_to_all(const Exec& exec, const VS& send, const VR& recv) const {
    return post_all_to_all(exec, send, recv, Mode::nonblocking);
  }

  /// \brief Non-blocking all_to_all_v; the count vectors are copied when it is posted.
  template <class Exec, class VS, class VR>
  [[nodiscard]] Request iall_to_all_v(const Exec& exec, const VS& send,
                                      const std::vector<std::size_t>& send_counts, const VR& recv,
                                      const std::vector<std::size_t>& recv_counts) const {
    return post_all_to_all_v(exec, send, send_counts, recv, recv_counts, Mode::nonblocking);
  }

  /// \brief Non-blocking send of `data` to group rank `peer`, always through MPI
  /// (see the file comment); pair it with irecv.
  template <class Exec, class V>
  [[nodiscard]] Request isend(const Exec& exec, const V& data, int peer, int tag = 0) const {
    return post_p2p(exec, data, peer, tag, Kind::send, Mode::nonblocking);
  }

  /// \brief Non-blocking receive into `data` from group rank `peer`, always through MPI
  /// (see the file comment); pair it with isend.
  template <class Exec, class V>
  [[nodiscard]] Request irecv(const Exec& exec, const V& data, int peer, int tag = 0) const {
    return post_p2p(exec, data, peer, tag, Kind::recv, Mode::nonblocking);
  }

  /// \brief Waits until every rank of the group arrives.
  void barrier() const;

private:
  friend class Batch; // comm/batch.hpp: point-to-point transfers posted together

  /// The route of a View of type V; `nccl_ok` is false for operations that
  /// always go through MPI (non-blocking point-to-point, see the file comment).
  template <class V>
  Route route_for(bool nccl_ok = true) const {
    constexpr bool host_ok =
        Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible;
    if (host_ok)
      return options_.stage_host_memory ? Route::staged : Route::host;
    return device_route(nccl_ok);
  }
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

  /// MPI needs the kernels that produce or still read its buffers finished; NCCL is
  /// stream-ordered.
  template <class Exec>
  void prepare(const Exec& exec, Route route) const {
    if (route != Route::nccl || options_.fence_timing)
      exec.fence();
  }
  /// After a backend call inside its watchdog::Scope: with fence_timing, a blocking call
  /// that was only enqueued (`pending` null, NCCL) is waited for there.
  template <class Exec>
  void settle(const Exec& exec, Route route, const std::unique_ptr<PendingOp>& pending) const {
    if (route == Route::nccl && options_.fence_timing && pending == nullptr)
      exec.fence();
  }

  template <class VS, class VR>
  void check_pair(const VS& send, const VR& recv, const char* op) const {
    static_assert(
        std::is_same_v<typename VS::non_const_value_type, typename VR::non_const_value_type>,
        "send and recv element types differ");
    static_assert(std::is_same_v<typename VS::memory_space, typename VR::memory_space>,
                  "send and recv live in different memory spaces");
    detail::require_contiguous(send, name_, op);
    detail::require_contiguous(recv, name_, op);
    const auto* s = reinterpret_cast<const char*>(send.data());
    const auto* r = reinterpret_cast<const char*>(recv.data());
    const auto sb = send.span() * sizeof(typename VS::value_type);
    const auto rb = recv.span() * sizeof(typename VR::value_type);
    CUBELM_ASSERT(sb == 0 || rb == 0 || s + sb <= r || r + rb <= s,
                  "group '" + name_ + "' " + op + ": send and recv overlap");
  }

  /// The first `count` elements of send into recv.
  template <class Exec, class VS, class VR>
  static void copy_flat(const Exec& exec, const VS& send, const VR& recv, std::size_t count) {
    using Flat = Kokkos::View<typename VR::non_const_value_type*, typename VR::memory_space,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using ConstFlat =
        Kokkos::View<const typename VR::non_const_value_type*, typename VS::memory_space,
                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    if (count > 0)
      Kokkos::deep_copy(exec, Flat(recv.data(), count), ConstFlat(send.data(), count));
  }

  // An operation with a non-blocking twin is one post_* function run in two
  // modes: its checks and traffic accounting (once per call), then route,
  // staging and backend call in post_one or post_pair. Mode::blocking runs the
  // backend's blocking call and returns a complete Request (so the blocking
  // twin's wait() returns at once); Mode::nonblocking returns the operation in
  // flight. broadcast and reduce share post_one and post_pair.

  /// A Request for `pending` (operation `what`) that runs `finish` once it
  /// completes; at once when the backend has already completed the operation
  /// (no PendingOp: Mode::blocking).
  template <class F>
  Request make_request(std::unique_ptr<PendingOp> pending, const char* what, F&& finish) const {
    if (pending == nullptr) {
      finish();
      return Request();
    }
    return Request(std::move(pending), std::forward<F>(finish), watch_name_, what);
  }

  /// The backend call of operation `what` on `route`, watched while it runs: a
  /// blocking one waits inside the library (and a backend's first use on device
  /// memory sets up NCCL, a collective too).
  template <class Exec, class F>
  std::unique_ptr<PendingOp> watched_call(const Exec& exec, Route route, const char* what,
                                          F&& call) const {
    const watchdog::Scope waiting(watch_name_, what);
    std::unique_ptr<PendingOp> pending = call();
    settle(exec, route, pending);
    return pending;
  }

  /// One View on `route`, staged on a host copy when the route needs it (copied
  /// in when `copy_in`, back on completion when `copy_out`). `call(backend,
  /// buffer, stream)` returns the backend's PendingOp (nullptr once done).
  template <class Exec, class V, class F>
  Request post_one(const Exec& exec, const V& data, Route route, bool copy_in, bool copy_out,
                   const char* what, F&& call) const {
    detail::Staged<V> buf(data, staging_, route == Route::staged, copy_in);
    prepare(exec, route);
    return make_request(
        watched_call(exec, route, what,
                     [&] { return call(backend(route), buf.data(), compat::native_stream(exec)); }),
        what, [buf, data, copy_out] {
          if (copy_out)
            buf.copy_back();
          (void)data; // held until completion
        });
  }

  /// send to recv (recv written only where `receives`): staged like post_one,
  /// `call(backend, send buffer, recv buffer, stream)`; a staged recv is copied in
  /// first when `partial` (the operation writes only part of it). A one-rank group
  /// copies `send` whole and completes at once.
  template <class Exec, class VS, class VR, class F>
  Request post_pair(const Exec& exec, const VS& send, const VR& recv, bool receives, Mode mode,
                    const char* what, F&& call, bool partial = false) const {
    if (size() == 1) {
      copy_flat(exec, send, recv, send.span());
      if (mode == Mode::nonblocking)
        exec.fence(); // the Request is complete: so is the copy
      return Request();
    }
    const Route route = route_for<VS>();
    detail::Staged<VS> in(send, staging_, route == Route::staged, true);
    detail::Staged<VR> out(recv, staging_, route == Route::staged && receives, partial);
    prepare(exec, route);
    return make_request(watched_call(exec, route, what,
                                     [&] {
                                       return call(backend(route), in.data(), out.data(),
                                                   compat::native_stream(exec));
                                     }),
                        what, [in, out, send, recv] {
                          out.copy_back();
                          (void)in, (void)send, (void)recv; // held until completion
                        });
  }

  template <class Exec, class V>
  Request post_all_reduce(const Exec& exec, const V& data, ReduceOp op, Mode mode) const {
    const char* what = mode == Mode::blocking ? "all_reduce" : "iall_reduce";
    detail::require_contiguous(data, name_, what);
    using T = typename V::non_const_value_type;
    const std::size_t n = data.span();
    account(Kind::all_reduce, n * sizeof(T));
    if (size() == 1)
      return Request();
    return post_one(exec, data, route_for<V>(), true, true, what,
                    [&](Backend& b, void* buf, void* stream) {
                      return b.all_reduce(buf, buf, n, data_type_of<T>(), op, stream, mode);
                    });
  }

  template <class Exec, class VS, class VR>
  Request post_all_gather(const Exec& exec, const VS& send, const VR& recv, Mode mode) const {
    const char* what = mode == Mode::blocking ? "all_gather" : "iall_gather";
    check_pair<VS, VR>(send, recv, what);
    using T = typename VR::non_const_value_type;
    const std::size_t n = send.span();
    check_blocks(recv.span(), n, what, "recv");
    account(Kind::all_gather, n * sizeof(T));
    return post_pair(exec, send, recv, true, mode, what,
                     [&](Backend& b, void* s, void* r, void* stream) {
                       return b.all_gather(s, r, n, data_type_of<T>(), stream, mode);
                     });
  }

  template <class Exec, class VS, class VR>
  Request post_reduce_scatter(const Exec& exec, const VS& send, const VR& recv, ReduceOp op,
                              Mode mode) const {
    const char* what = mode == Mode::blocking ? "reduce_scatter" : "ireduce_scatter";
    check_pair<VS, VR>(send, recv, what);
    using T = typename VR::non_const_value_type;
    const std::size_t n = recv.span();
    check_blocks(send.span(), n, what, "send");
    account(Kind::reduce_scatter, n * sizeof(T));
    return post_pair(exec, send, recv, true, mode, what,
                     [&](Backend& b, void* s, void* r, void* stream) {
                       return b.reduce_scatter(s, r, n, data_type_of<T>(), op, stream, mode);
                     });
  }

  template <class Exec, class VS, class VR>
  Request post_all_to_all(const Exec& exec, const VS& send, const VR& recv, Mode mode) const {
    const char* what = mode == Mode::blocking ? "all_to_all" : "iall_to_all";
    check_pair<VS, VR>(send, recv, what);
    check_equal_blocks(send.span(), recv.span(), what);
    using T = typename VR::non_const_value_type;
    const std::size_t n = send.span() / static_cast<std::size_t>(size());
    account(Kind::all_to_all, static_cast<std::size_t>(size() - 1) * n * sizeof(T));
    return post_pair(exec, send, recv, true, mode, what,
                     [&](Backend& b, void* s, void* r, void* stream) {
                       return b.all_to_all(s, r, n, data_type_of<T>(), stream, mode);
                     });
  }

  template <class Exec, class VS, class VR>
  Request post_all_to_all_v(const Exec& exec, const VS& send,
                            const std::vector<std::size_t>& send_counts, const VR& recv,
                            const std::vector<std::size_t>& recv_counts, Mode mode) const {
    const char* what = mode == Mode::blocking ? "all_to_all_v" : "iall_to_all_v";
    check_pair<VS, VR>(send, recv, what);
    using T = typename VR::non_const_value_type;
    const std::size_t to_others =
        check_counts(send_counts, send.span(), recv_counts, recv.span(), what);
    account(Kind::all_to_all, to_others * sizeof(T));
    if (size() == 1) { // only the block a rank keeps; the rest of recv stays
      copy_flat(exec, send, recv, send_counts[0]);
      if (mode == Mode::nonblocking)
        exec.fence(); // the Request is complete: so is the copy
      return Request();
    }
    return post_pair(
        exec, send, recv, true, mode, what,
        [&](Backend& b, void* s, void* r, void* stream) {
          return b.all_to_all_v(s, send_counts, r, recv_counts, data_type_of<T>(), stream, mode);
        },
        true);
  }

  /// send, recv, isend, irecv (`kind` is Kind::send or Kind::recv). The
  /// non-blocking ones always go through MPI (see the file comment).
  template <class Exec, class V>
  Request post_p2p(const Exec& exec, const V& data, int peer, int tag, Kind kind, Mode mode) const {
    const bool sending = kind == Kind::send;
    const bool blocking = mode == Mode::blocking;
    const char* what = sending ? (blocking ? "send" : "isend") : (blocking ? "recv" : "irecv");
    detail::require_contiguous(data, name_, what);
    check_peer(peer, what);
    using T = typename V::non_const_value_type;
    const std::size_t n = data.span();
    account(kind, n * sizeof(T));
    return post_one(exec, data, route_for<V>(blocking), sending, !sending, what,
                    [&](Backend& b, void* buf, void* stream) {
                      return sending ? b.send(buf, n, data_type_of<T>(), peer, tag, stream, mode)
                                     : b.recv(buf, n, data_type_of<T>(), peer, tag, stream, mode);
                    });
  }

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
