#pragma once
/// \file
/// \brief A communication operation in flight: what Group::isend, irecv,
/// iall_reduce, ireduce_scatter and iall_gather return.
///
/// A Request owns everything the operation needs until it completes: the
/// backend's handle (an MPI_Request, or the CUDA event behind a stream-ordered
/// NCCL call), the host copies of staged device Views, and references to the
/// caller's Views (so they stay allocated even if the caller drops them).
/// Completing it (test() returning true, or wait()) also finishes what the
/// blocking operation does after the library call, e.g. copies a staged
/// result back into the device View. Only then may a received View be read or
/// a sent View be written.
///
/// The destructor of an active Request waits for it, so no MPI request is ever
/// leaked. That wait blocks: a Request dropped on one rank still needs its
/// partners to post the matching operation, exactly as if wait() were called.
///
/// wait_on(exec) is for consumers on a GPU stream: an operation on a stream of
/// its own (NCCL's communication stream) becomes a dependency of `exec`'s stream
/// and the host goes on; anything else is waited for on the host.

#include "cubelm/comm/backend.hpp"
#include "cubelm/core/compat.hpp"

#include <functional>
#include <memory>
#include <vector>

namespace cubelm::comm {

/// \brief A move-only handle of one non-blocking operation; default-constructed it is complete.
class Request {
public:
  /// \brief A complete Request (nothing in flight).
  Request() = default;
  /// \brief For the comm layer: `op` in flight, then `finish` once it has completed
  /// (copies staged results back; its captures keep buffers alive until then).
  /// `group` (a watchdog::intern()ed name) and `what` ("iall_reduce", "irecv", ...)
  /// name a wait that makes no progress (comm/watchdog.hpp).
  Request(std::unique_ptr<PendingOp> op, std::function<void()> finish, const char* group,
          const char* what);

  Request(Request&& other) noexcept;
  /// \brief Waits for the operation this Request holds, then takes over `other`'s.
  Request& operator=(Request&& other);
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  /// \brief Waits when still active (see the file comment).
  ~Request();

  /// \brief True when the operation is complete; completes it (results are in
  /// place). Never blocks. Returns true again after that.
  bool test();
  /// \brief Blocks until the operation is complete; results are in place afterwards.
  void wait();
  /// \brief Orders the work enqueued on `exec` from now on after the operation.
  ///
  /// An operation on a GPU stream (NCCL) makes the stream of a stream-ordered `exec`
  /// (compat::stream_ordered) wait for the event recorded after it, without blocking
  /// the host; the Request stays active until test(), wait() or the destructor
  /// completes it on the host, so its buffers stay allocated until then. Anything else
  /// (MPI, a staged host copy, a host execution space) is completed here, as by wait().
  template <class Exec>
  void wait_on(const Exec& exec) {
    if constexpr (compat::stream_ordered<Exec>::value)
      if (op_ != nullptr && op_->enqueue_wait(compat::native_stream(exec)))
        return;
    wait();
  }

  /// \brief True while the operation is in flight (not yet completed by test/wait).
  bool active() const { return op_ != nullptr; }
  /// \brief True once completed, and for a default-constructed Request.
  bool done() const { return op_ == nullptr; }

private:
  void finish();

  std::unique_ptr<PendingOp> op_;
  std::function<void()> finish_;
  const char* group_ = nullptr;
  const char* what_ = nullptr;
};

/// \brief Waits for every Request of `requests` (in order; each completes as it is reached).
void wait_all(std::vector<Request>& requests);

/// \brief True when every Request of `requests` is complete; tests each one that is not.
bool test_all(std::vector<Request>& requests);

} // namespace cubelm::comm
