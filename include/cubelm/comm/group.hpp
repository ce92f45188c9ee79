#pragma once
/// \file
/// \brief A named group of ranks with collectives on Kokkos Views.
///
/// Every operation takes the execution space instance first. Views must be
/// contiguous; their elements are treated as one flat array in memory order.
/// Host-accessible memory goes through MPI. Device memory goes through NCCL
/// when cubelm is built with it, otherwise through MPI: directly when
/// GPU-aware MPI is switched on (CommOptions), else staged through a host copy.
/// Each call adds its modelled bytes sent to the group's TrafficCounters.
///
/// isend, irecv, iall_reduce, ireduce_scatter and iall_gather are the
/// non-blocking twins of send, recv, all_reduce, reduce_scatter and
/// all_gather: same arguments, same checks, same traffic accounting (counted
/// when posted), and a Request (comm/request.hpp) that completes them. Until
/// it completes, a View being sent must not be written and a View being
/// received must not be read. Non-blocking collectives take the route of their
/// blocking twins (NCCL enqueues them on the execution space's stream), and
/// every rank must post a group's collectives in the same order. isend and
/// irecv always go through MPI, also for device memory when NCCL is on
/// (directly with GPU-aware MPI, else staged through a host copy): NCCL
/// point-to-point calls on one stream cannot keep a send and a receive in
/// flight independently of each other. So with NCCL on, a device View sent
/// with isend must be received with irecv, and one sent with send with recv.
/// The non-blocking calls are [[nodiscard]]: a Request dropped at once waits
/// in its destructor, which makes the call blocking (and can deadlock a ring).

#include "cubelm/comm/backend.hpp"
#include "cubelm/comm/communicator.hpp"
#include "cubelm/comm/request.hpp"
#include "cubelm/comm/traffic.hpp"
#include "cubelm/core/compat.hpp"
#include "cubelm/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <memory>
#include <string>

namespace cubelm::comm {

/// \brief How device memory is moved; read once per process grid.
struct CommOptions {
  /// Hand device pointers to MPI (only for an MPI library built with CUDA support).
  bool gpu_aware_mpi = false;
  /// Use NCCL for device memory when cubelm was built with it.
  bool use_nccl = true;
  /// \brief Defaults overridden by CUBELM_GPU_AWARE_MPI=1 and CUBELM_USE_NCCL=0.
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

/// A View seen as a flat buffer, with a host copy when it must be staged.
template <class V>
class Staged {
  using value_type = typename V::value_type;
  using T = std::remove_const_t<value_type>;
  using Flat =
      Kokkos::View<value_type*, typename V::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using HostFlat = Kokkos::View<T*, Kokkos::HostSpace>;

public:
  Staged(const V& view, bool stage, bool copy_in) : flat_(view.data(), view.span()) {
    if (stage && view.span() > 0) {
      host_ = HostFlat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "cubelm::comm::stage"),
                       view.span());
      if (copy_in)
        Kokkos::deep_copy(host_, flat_);
    }
  }
  void* data() const {
    return host_.data() != nullptr ? static_cast<void*>(host_.data())
                                   : const_cast<void*>(static_cast<const void*>(flat_.data()));
  }
  /// Copies a staged result back to the original View.
  void copy_back() const {
    if constexpr (!std::is_const_v<value_type>)
      if (host_.data() != nullptr)
        Kokkos::deep_copy(flat_, host_);
  }

private:
  Flat flat_;
  HostFlat host_;
};

} // namespace detail

/// \brief A named communicator with collectives on Views and traffic accounting.
class Group {
public:
  Group(std::string name, Communicator comm, std::shared_ptr<TrafficCounters> traffic,
        CommOptions options = {});

  const std::string& name() const { return name_; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  const Communicator& communicator() const { return comm_; }
  const TrafficCounters& traffic() const { return *traffic_; }

  /// \brief In-place reduction of `data` over the group.
  template <class Exec, class V>
  void all_reduce(const Exec& exec, const V& data, ReduceOp op = ReduceOp::sum) const {
    detail::require_contiguous(data, name_, "all_reduce");
    using T = typename V::non_const_value_type;
    const std::size_t n = data.span();
    account(Kind::all_reduce, n * sizeof(T));
    if (size() == 1)
      return;
    const Route route = route_for<V>();
    detail::Staged<V> buf(data, route == Route::staged, true);
    prepare(exec, route);
    backend(route).all_reduce(buf.data(), buf.data(), n, data_type_of<T>(), op,
                              compat::native_stream(exec));
    buf.copy_back();
  }

  /// \brief recv = concatenation of every rank's send, in group-rank order.
  template <class Exec, class VS, class VR>
  void all_gather(const Exec& exec, const VS& send, const VR& recv) const {
    check_pair<VS, VR>(send, recv, "all_gather");
    using T = typename VR::non_const_value_type;
    const std::size_t n = send.span();
    CUBELM_ASSERT(recv.span() == n * static_cast<std::size_t>(size()),
                  "group '" + name_ + "' all_gather: recv has " + std::to_string(recv.span()) +
                      " elements, expected " + std::to_string(size()) + " x " + std::to_string(n));
    account(Kind::all_gather, n * sizeof(T));
    run_pair(exec, send, recv, [&](Backend& b, void* s, void* r, void* stream) {
      b.all_gather(s, r, n, data_type_of<T>(), stream);
    });
  }

  /// \brief recv = block `rank()` of the elementwise reduction of every rank's send.
  template <class Exec, class VS, class VR>
  void reduce_scatter(const Exec& exec, const VS& send, const VR& recv,
                      ReduceOp op = ReduceOp::sum) const {
    check_pair<VS, VR>(send, recv, "reduce_scatter");
    using T = typename VR::non_const_value_type;
    const std::size_t n = recv.span();
    CUBELM_ASSERT(send.span() == n * static_cast<std::size_t>(size()),
                  "group '" + name_ + "' reduce_scatter: send has " + std::to_string(send.span()) +
                      " elements, expected " + std::to_string(size()) + " x " + std::to_string(n));
    account(Kind::reduce_scatter, n * sizeof(T));
    run_pair(exec, send, recv, [&](Backend& b, void* s, void* r, void* stream) {
      b.reduce_scatter(s, r, n, data_type_of<T>(), op, stream);
    });
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
    const Route route = route_for<V>();
    detail::Staged<V> buf(data, route == Route::staged, rank() == root);
    prepare(exec, route);
    backend(route).broadcast(buf.data(), n, data_type_of<T>(), root, compat::native_stream(exec));
    buf.copy_back();
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
    const Route route = route_for<VS>();
    if (size() == 1) {
      copy_flat(exec, send, recv);
      return;
    }
    detail::Staged<VS> in(send, route == Route::staged, true);
    detail::Staged<VR> out(recv, route == Route::staged && rank() == root, false);
    prepare(exec, route);
    backend(route).reduce(in.data(), out.data(), n, data_type_of<T>(), op, root,
                          compat::native_stream(exec));
    if (rank() == root)
      out.copy_back();
  }

  /// \brief Blocking send of `data` to group rank `peer`.
  template <class Exec, class V>
  void send(const Exec& exec, const V& data, int peer, int tag = 0) const {
    detail::require_contiguous(data, name_, "send");
    check_peer(peer, "send");
    using T = typename V::non_const_value_type;
    account(Kind::send, data.span() * sizeof(T));
    const Route route = route_for<V>();
    detail::Staged<V> buf(data, route == Route::staged, true);
    prepare(exec, route);
    backend(route).send(buf.data(), data.span(), data_type_of<T>(), peer, tag,
                        compat::native_stream(exec));
  }

  /// \brief Blocking receive into `data` from group rank `peer`.
  template <class Exec, class V>
  void recv(const Exec& exec, const V& data, int peer, int tag = 0) const {
    detail::require_contiguous(data, name_, "recv");
    check_peer(peer, "recv");
    using T = typename V::non_const_value_type;
    account(Kind::recv, data.span() * sizeof(T));
    const Route route = route_for<V>();
    detail::Staged<V> buf(data, route == Route::staged, false);
    prepare(exec, route);
    backend(route).recv(buf.data(), data.span(), data_type_of<T>(), peer, tag,
                        compat::native_stream(exec));
    buf.copy_back();
  }

  /// \brief Non-blocking all_reduce: `data` holds the reduction once the Request completes.
  /// A one-rank group returns a complete Request.
  template <class Exec, class V>
  [[nodiscard]] Request iall_reduce(const Exec& exec, const V& data,
                                    ReduceOp op = ReduceOp::sum) const {
    detail::require_contiguous(data, name_, "iall_reduce");
    using T = typename V::non_const_value_type;
    const std::size_t n = data.span();
    account(Kind::all_reduce, n * sizeof(T));
    if (size() == 1)
      return Request();
    const Route route = route_for<V>();
    detail::Staged<V> buf(data, route == Route::staged, true);
    prepare(exec, route);
    auto pending = backend(route).iall_reduce(buf.data(), buf.data(), n, data_type_of<T>(), op,
                                              compat::native_stream(exec));
    return Request(std::move(pending), [buf, data] {
      buf.copy_back();
      (void)data; // held until completion
    });
  }

  /// \brief Non-blocking all_gather (same layout of recv).
  template <class Exec, class VS, class VR>
  [[nodiscard]] Request iall_gather(const Exec& exec, const VS& send, const VR& recv) const {
    check_pair<VS, VR>(send, recv, "iall_gather");
    using T = typename VR::non_const_value_type;
    const std::size_t n = send.span();
    CUBELM_ASSERT(recv.span() == n * static_cast<std::size_t>(size()),
                  "group '" + name_ + "' iall_gather: recv has " + std::to_string(recv.span()) +
                      " elements, expected " + std::to_string(size()) + " x " + std::to_string(n));
    account(Kind::all_gather, n * sizeof(T));
    return start_pair(exec, send, recv, [&](Backend& b, void* s, void* r, void* stream) {
      return b.iall_gather(s, r, n, data_type_of<T>(), stream);
    });
  }

  /// \brief Non-blocking reduce_scatter (recv gets block `rank()`).
  template <class Exec, class VS, class VR>
  [[nodiscard]] Request ireduce_scatter(const Exec& exec, const VS& send, const VR& recv,
                                        ReduceOp op = ReduceOp::sum) const {
    check_pair<VS, VR>(send, recv, "ireduce_scatter");
    using T = typename VR::non_const_value_type;
    const std::size_t n = recv.span();
    CUBELM_ASSERT(send.span() == n * static_cast<std::size_t>(size()),
                  "group '" + name_ + "' ireduce_scatter: send has " + std::to_string(send.span()) +
                      " elements, expected " + std::to_string(size()) + " x " + std::to_string(n));
    account(Kind::reduce_scatter, n * sizeof(T));
    return start_pair(exec, send, recv, [&](Backend& b, void* s, void* r, void* stream) {
      return b.ireduce_scatter(s, r, n, data_type_of<T>(), op, stream);
    });
  }

  /// \brief Non-blocking send of `data` to group rank `peer`, always through MPI
  /// (see the file comment); pair it with irecv.
  template <class Exec, class V>
  [[nodiscard]] Request isend(const Exec& exec, const V& data, int peer, int tag = 0) const {
    detail::require_contiguous(data, name_, "isend");
    check_peer(peer, "isend");
    using T = typename V::non_const_value_type;
    account(Kind::send, data.span() * sizeof(T));
    const Route route = p2p_route_for<V>();
    detail::Staged<V> buf(data, route == Route::staged, true);
    exec.fence(); // MPI reads the buffer: the kernels producing it must be done
    auto pending = host_backend_->isend(buf.data(), data.span(), data_type_of<T>(), peer, tag,
                                        compat::native_stream(exec));
    return Request(std::move(pending), [buf, data] { (void)buf, (void)data; });
  }

  /// \brief Non-blocking receive into `data` from group rank `peer`, always through MPI
  /// (see the file comment); pair it with isend.
  template <class Exec, class V>
  [[nodiscard]] Request irecv(const Exec& exec, const V& data, int peer, int tag = 0) const {
    detail::require_contiguous(data, name_, "irecv");
    check_peer(peer, "irecv");
    using T = typename V::non_const_value_type;
    account(Kind::recv, data.span() * sizeof(T));
    const Route route = p2p_route_for<V>();
    detail::Staged<V> buf(data, route == Route::staged, false);
    exec.fence(); // kernels still reading the old contents must be done before MPI writes
    auto pending = host_backend_->irecv(buf.data(), data.span(), data_type_of<T>(), peer, tag,
                                        compat::native_stream(exec));
    return Request(std::move(pending), [buf, data] {
      buf.copy_back();
      (void)data;
    });
  }

  /// \brief Waits until every rank of the group arrives.
  void barrier() const;

private:
  /// Host memory through MPI; device memory through NCCL or GPU-aware MPI
  /// (direct), or through MPI on a host copy (staged).
  enum class Route { host, direct, staged };

  template <class V>
  Route route_for() const {
    constexpr bool host_ok =
        Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible;
    return host_ok ? Route::host : device_route();
  }
  Route device_route() const;
  /// Point-to-point non-blocking operations always use MPI: host memory as is,
  /// device memory directly with GPU-aware MPI, else through a host copy.
  template <class V>
  Route p2p_route_for() const {
    constexpr bool host_ok =
        Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible;
    return host_ok ? Route::host : options_.gpu_aware_mpi ? Route::direct : Route::staged;
  }
  Backend& backend(Route route) const;
  void account(Kind kind, std::size_t message_bytes) const;
  void check_peer(int peer, const char* op) const;

  /// Host routes need the producing kernels finished; NCCL is stream-ordered.
  template <class Exec>
  void prepare(const Exec& exec, Route route) const {
    if (!(route == Route::direct && stream_ordered_device()))
      exec.fence();
  }
  bool stream_ordered_device() const;

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

  template <class Exec, class VS, class VR>
  static void copy_flat(const Exec& exec, const VS& send, const VR& recv) {
    using Flat = Kokkos::View<typename VR::non_const_value_type*, typename VR::memory_space,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using ConstFlat =
        Kokkos::View<const typename VR::non_const_value_type*, typename VS::memory_space,
                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    if (send.span() > 0)
      Kokkos::deep_copy(exec, Flat(recv.data(), recv.span()), ConstFlat(send.data(), send.span()));
  }

  template <class Exec, class VS, class VR, class F>
  void run_pair(const Exec& exec, const VS& send, const VR& recv, F&& call) const {
    if (size() == 1) {
      copy_flat(exec, send, recv);
      return;
    }
    const Route route = route_for<VS>();
    detail::Staged<VS> in(send, route == Route::staged, true);
    detail::Staged<VR> out(recv, route == Route::staged, false);
    prepare(exec, route);
    call(backend(route), in.data(), out.data(), compat::native_stream(exec));
    out.copy_back();
  }

  // The non-blocking twin of run_pair. A one-rank group copies and completes at once.
  template <class Exec, class VS, class VR, class F>
  Request start_pair(const Exec& exec, const VS& send, const VR& recv, F&& call) const {
    if (size() == 1) {
      copy_flat(exec, send, recv);
      exec.fence();
      return Request();
    }
    const Route route = route_for<VS>();
    detail::Staged<VS> in(send, route == Route::staged, true);
    detail::Staged<VR> out(recv, route == Route::staged, false);
    prepare(exec, route);
    auto pending = call(backend(route), in.data(), out.data(), compat::native_stream(exec));
    return Request(std::move(pending), [in, out, send, recv] {
      out.copy_back();
      (void)in, (void)send, (void)recv; // held until completion
    });
  }

  std::string name_;
  Communicator comm_;
  std::shared_ptr<TrafficCounters> traffic_;
  CommOptions options_;
  std::shared_ptr<Backend> host_backend_;
  // Created on first use by a collective call on device memory (all ranks of
  // the group make that call, so the lazy NCCL initialisation is collective too).
  mutable std::shared_ptr<Backend> device_backend_;
};

} // namespace cubelm::comm
