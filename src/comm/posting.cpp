// What Group's collective templates run once a View is a Buffer and the execution space an
// ExecRef: the checks, the traffic accounting, the route, the staging through host
// copies and the backend call, each operation written once for its blocking and its
// non-blocking mode (comm/group.hpp).

#include "cubelm/comm/group.hpp"
#include "cubelm/comm/watchdog.hpp"

#include "staged.hpp"

#include <memory>
#include <string>
#include <utility>

namespace cubelm::comm {

namespace detail {

// An operation with a non-blocking twin is one Group::post_* function run in two modes:
// its checks and traffic accounting (once per call), then route, staging and backend
// call in one() or pair(). Mode::blocking runs the backend's blocking call and returns a
// complete Request (so the blocking twin's wait() returns at once); Mode::nonblocking
// returns the operation in flight. broadcast and reduce share one() and pair().
struct Posting {
  using Route = Group::Route;

  /// MPI needs the kernels that produce or still read its buffers finished; NCCL is
  /// stream-ordered.
  static void prepare(const Group& g, const ExecRef& exec, Route route) {
    if (route != Route::nccl || g.options_.fence_timing)
      exec.fence(exec.space);
  }

  /// After a backend call inside its watchdog::Scope: with fence_timing, a blocking call
  /// that was only enqueued (`pending` null, NCCL) is waited for there.
  static void settle(const Group& g, const ExecRef& exec, Route route,
                     const std::unique_ptr<PendingOp>& pending) {
    if (route == Route::nccl && g.options_.fence_timing && pending == nullptr)
      exec.fence(exec.space);
  }

  /// A Request for `pending` (operation `what`) that runs `finish` once it completes; at
  /// once when the backend has already completed the operation (no PendingOp:
  /// Mode::blocking).
  template <class F>
  static Request make_request(const Group& g, std::unique_ptr<PendingOp> pending, const char* what,
                              F&& finish) {
    if (pending == nullptr) {
      finish();
      return Request();
    }
    return Request(std::move(pending), std::forward<F>(finish), g.watch_name_, what);
  }

  /// The backend call of operation `what` on `route`, watched while it runs: a blocking
  /// one waits inside the library (and a backend's first use on device memory sets up
  /// NCCL, a collective too).
  template <class F>
  static std::unique_ptr<PendingOp> watched_call(const Group& g, const ExecRef& exec, Route route,
                                                 const char* what, F&& call) {
    const watchdog::Scope waiting(g.watch_name_, what);
    std::unique_ptr<PendingOp> pending = call();
    settle(g, exec, route, pending);
    return pending;
  }

  /// One buffer on `route`, staged on a host copy when the route needs it (copied in
  /// when `copy_in`, back on completion when `copy_out`). `call(backend, buffer,
  /// stream)` returns the backend's PendingOp (nullptr once done).
  template <class F>
  static Request one(const Group& g, const ExecRef& exec, const Buffer& data, Route route,
                     bool copy_in, bool copy_out, const char* what, F&& call) {
    const Staged buf(data, g.staging_, route == Route::staged, copy_in);
    prepare(g, exec, route);
    return make_request(
        g,
        watched_call(g, exec, route, what,
                     [&] { return call(g.backend(route), buf.data(), exec.stream); }),
        what, [buf, copy_out] {
          if (copy_out)
            buf.copy_back();
        });
  }

  /// The first `count` elements of send into recv, ordered on the execution space.
  static void copy_flat(const ExecRef& exec, const Buffer& send, const Buffer& recv,
                        std::size_t count) {
    if (count > 0)
      exec.copy(exec.space, recv.data, send.data, count * send.element_bytes, send.host);
  }

  /// send to recv (recv written only where `receives`): staged like one(), `call(backend,
  /// send buffer, recv buffer, stream)`; a staged recv is copied in first when `partial`
  /// (the operation writes only part of it). A one-rank group copies `send` whole and
  /// completes at once.
  template <class F>
  static Request pair(const Group& g, const ExecRef& exec, const Buffer& send, const Buffer& recv,
                      bool receives, Mode mode, const char* what, F&& call, bool partial = false) {
    if (g.size() == 1) {
      copy_flat(exec, send, recv, send.count);
      if (mode == Mode::nonblocking)
        exec.fence(exec.space); // the Request is complete: so is the copy
      return Request();
    }
    const Route route = g.route_for(send.host);
    const Staged in(send, g.staging_, route == Route::staged, true);
    const Staged out(recv, g.staging_, route == Route::staged && receives, partial);
    prepare(g, exec, route);
    return make_request(
        g,
        watched_call(g, exec, route, what,
                     [&] { return call(g.backend(route), in.data(), out.data(), exec.stream); }),
        what, [in, out] {
          out.copy_back();
          (void)in; // held until completion
        });
  }

  /// send and recv of one operation must not overlap.
  static void check_apart(const Group& g, const Buffer& send, const Buffer& recv, const char* op) {
    const auto* s = static_cast<const char*>(send.data);
    const auto* r = static_cast<const char*>(recv.data);
    const std::size_t sb = send.count * send.element_bytes, rb = recv.count * recv.element_bytes;
    CUBELM_ASSERT(sb == 0 || rb == 0 || s + sb <= r || r + rb <= s,
                  "group '" + g.name_ + "' " + op + ": send and recv overlap");
  }
};

} // namespace detail

using detail::Posting;

Group::Route Group::route_for(bool host, bool nccl_ok) const {
  if (host)
    return options_.stage_host_memory ? Route::staged : Route::host;
  return device_route(nccl_ok);
}

Request Group::post_all_reduce(const detail::ExecRef& exec, const detail::Buffer& data, ReduceOp op,
                               Mode mode) const {
  const char* what = mode == Mode::blocking ? "all_reduce" : "iall_reduce";
  const std::size_t n = data.count;
  account(Kind::all_reduce, n * data.element_bytes);
  if (size() == 1)
    return Request();
  return Posting::one(*this, exec, data, route_for(data.host), true, true, what,
                      [&](Backend& b, void* buf, void* stream) {
                        return b.all_reduce(buf, buf, n, data.type, op, stream, mode);
                      });
}

Request Group::post_all_gather(const detail::ExecRef& exec, const detail::Buffer& send,
                               const detail::Buffer& recv, Mode mode) const {
  const char* what = mode == Mode::blocking ? "all_gather" : "iall_gather";
  Posting::check_apart(*this, send, recv, what);
  const std::size_t n = send.count;
  check_blocks(recv.count, n, what, "recv");
  account(Kind::all_gather, n * send.element_bytes);
  return Posting::pair(*this, exec, send, recv, true, mode, what,
                       [&](Backend& b, void* s, void* r, void* stream) {
                         return b.all_gather(s, r, n, send.type, stream, mode);
                       });
}

Request Group::post_reduce_scatter(const detail::ExecRef& exec, const detail::Buffer& send,
                                   const detail::Buffer& recv, ReduceOp op, Mode mode) const {
  const char* what = mode == Mode::blocking ? "reduce_scatter" : "ireduce_scatter";
  Posting::check_apart(*this, send, recv, what);
  const std::size_t n = recv.count;
  check_blocks(send.count, n, what, "send");
  account(Kind::reduce_scatter, n * recv.element_bytes);
  return Posting::pair(*this, exec, send, recv, true, mode, what,
                       [&](Backend& b, void* s, void* r, void* stream) {
                         return b.reduce_scatter(s, r, n, send.type, op, stream, mode);
                       });
}

Request Group::post_all_to_all(const detail::ExecRef& exec, const detail::Buffer& send,
                               const detail::Buffer& recv, Mode mode) const {
  const char* what = mode == Mode::blocking ? "all_to_all" : "iall_to_all";
  Posting::check_apart(*this, send, recv, what);
  check_equal_blocks(send.count, recv.count, what);
  const std::size_t n = send.count / static_cast<std::size_t>(size());
  account(Kind::all_to_all, static_cast<std::size_t>(size() - 1) * n * send.element_bytes);
  return Posting::pair(*this, exec, send, recv, true, mode, what,
                       [&](Backend& b, void* s, void* r, void* stream) {
                         return b.all_to_all(s, r, n, send.type, stream, mode);
                       });
}

Request Group::post_all_to_all_v(const detail::ExecRef& exec, const detail::Buffer& send,
                                 const std::vector<std::size_t>& send_counts,
                                 const detail::Buffer& recv,
                                 const std::vector<std::size_t>& recv_counts, Mode mode) const {
  const char* what = mode == Mode::blocking ? "all_to_all_v" : "iall_to_all_v";
  Posting::check_apart(*this, send, recv, what);
  const std::size_t to_others =
      check_counts(send_counts, send.count, recv_counts, recv.count, what);
  account(Kind::all_to_all, to_others * send.element_bytes);
  if (size() == 1) { // only the block a rank keeps; the rest of recv stays
    Posting::copy_flat(exec, send, recv, send_counts[0]);
    if (mode == Mode::nonblocking)
      exec.fence(exec.space); // the Request is complete: so is the copy
    return Request();
  }
  return Posting::pair(
      *this, exec, send, recv, true, mode, what,
      [&](Backend& b, void* s, void* r, void* stream) {
        return b.all_to_all_v(s, send_counts, r, recv_counts, send.type, stream, mode);
      },
      true);
}

Request Group::post_p2p(const detail::ExecRef& exec, const detail::Buffer& data, int peer, int tag,
                        Kind kind, Mode mode) const {
  const bool sending = kind == Kind::send;
  const bool blocking = mode == Mode::blocking;
  const char* what = sending ? (blocking ? "send" : "isend") : (blocking ? "recv" : "irecv");
  check_peer(peer, what);
  const std::size_t n = data.count;
  account(kind, n * data.element_bytes);
  return Posting::one(*this, exec, data, route_for(data.host, blocking), sending, !sending, what,
                      [&](Backend& b, void* buf, void* stream) {
                        return sending ? b.send(buf, n, data.type, peer, tag, stream, mode)
                                       : b.recv(buf, n, data.type, peer, tag, stream, mode);
                      });
}

void Group::post_broadcast(const detail::ExecRef& exec, const detail::Buffer& data,
                           int root) const {
  check_peer(root, "broadcast");
  const std::size_t n = data.count;
  account(Kind::broadcast, n * data.element_bytes);
  if (size() == 1)
    return;
  Posting::one(*this, exec, data, route_for(data.host), rank() == root, true, "broadcast",
               [&](Backend& b, void* buf, void* stream) {
                 b.broadcast(buf, n, data.type, root, stream);
                 return std::unique_ptr<PendingOp>();
               });
}

void Group::post_reduce(const detail::ExecRef& exec, const detail::Buffer& send,
                        const detail::Buffer& recv, int root, ReduceOp op) const {
  check_peer(root, "reduce");
  const std::size_t n = send.count;
  if (rank() == root)
    CUBELM_ASSERT(recv.count == n, "group '" + name_ + "' reduce: recv on the root has " +
                                       std::to_string(recv.count) + " elements, expected " +
                                       std::to_string(n));
  account(Kind::reduce, n * send.element_bytes);
  Posting::pair(*this, exec, send, recv, rank() == root, Mode::blocking, "reduce",
                [&](Backend& b, void* s, void* r, void* stream) {
                  b.reduce(s, r, n, send.type, op, root, stream);
                  return std::unique_ptr<PendingOp>();
                });
}

} // namespace cubelm::comm
