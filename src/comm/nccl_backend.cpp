// NCCL on device memory, on two streams (docs/communication.md, "Streams"):
//  - blocking calls are enqueued on the caller's stream (the execution space's),
//    in order with the Kokkos kernels that produce and consume their buffers;
//  - non-blocking collectives and batches of point-to-point transfers run on the
//    backend's communication stream, so that they overlap the caller's kernels.
//    An event recorded on the caller's stream, which the communication stream
//    waits for, orders them after the producers; an event recorded after them
//    completes their Requests, and a consumer's stream can wait for it
//    (PendingOp::enqueue_wait) instead of the host.
// Events come from a pool (HandlePool) and go back to it; none is created per
// operation in steady state. NCCL runs the operations of one communicator in
// the order each rank issues them; a blocking call after non-blocking ones of
// the same communicator therefore waits for them on the GPU.
//
// Watched for hangs (docs/reliability.md, "Hang watchdog"): an NCCL call
// returns once enqueued, and an operation that never completes blocks whatever
// waits for its stream later, often a fence outside comm. So while the watchdog
// is armed every call is followed by an event that the watchdog's thread polls
// (DeviceWatch), with NCCL's asynchronous error; a Request waits by polling its
// event and that error instead of blocking in cudaEventSynchronize. On a
// timeout or an error the communicator is aborted (ncclCommAbort, which ends its
// kernels) before the job is.

#include "backends.hpp"
#include "handle_pool.hpp"
#include "watchdog_detail.hpp"

#include "cubelm/core/error.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace cubelm::comm::detail {
namespace {

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
  case DataType::f32:
    return ncclFloat32;
  case DataType::f64:
    return ncclFloat64;
  case DataType::i32:
    return ncclInt32;
  case DataType::i64:
    return ncclInt64;
  case DataType::u8:
    return ncclUint8;
  case DataType::u64:
    return ncclUint64;
  case DataType::bf16:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    return ncclBfloat16; // reduced in float, rounded to bfloat16 (as bf16_op for MPI)
#else
    throw Error("cubelm::comm: this NCCL (" + std::to_string(NCCL_VERSION_CODE) +
                ") has no bfloat16; 2.10 or newer is needed for train.precision = \"bf16\"");
#endif
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
  case ReduceOp::sum:
    return ncclSum;
  case ReduceOp::max:
    return ncclMax;
  case ReduceOp::min:
    return ncclMin;
  }
  return ncclSum;
}

cudaStream_t as_stream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

// The NCCL communicator, shared by the backend and its operations in flight so
// that ncclCommDestroy runs only after the last of them is gone.
using NcclComm = std::shared_ptr<std::remove_pointer_t<ncclComm_t>>;

void destroy_nccl_comm(ncclComm_t comm) {
  ncclCommDestroy(comm);
}

// An error NCCL reports for work in flight; ncclInProgress (NCCL 2.14+) is a
// communicator still being set up, no failure.
bool nccl_failed(ncclResult_t rc) {
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  if (rc == ncclInProgress)
    return false;
#endif
  return rc != ncclSuccess;
}

// NCCL's asynchronous error of `comm` (ncclSuccess when there is none).
ncclResult_t async_error(ncclComm_t comm) {
  ncclResult_t async = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm, &async);
  return rc != ncclSuccess ? rc : async;
}

watchdog::Stall nccl_error(ncclResult_t rc, const char* group, const char* op) {
  watchdog::Stall s;
  s.group = group;
  s.op = op;
  s.step = watchdog::detail::step();
  s.micro = watchdog::detail::micro_batch();
  s.error = std::string("NCCL error (") + ncclGetErrorString(rc) + ")";
  return s;
}

using EventPool = HandlePool<cudaEvent_t>;
using Event = Pooled<cudaEvent_t>;

std::shared_ptr<EventPool> make_event_pool() {
  return std::make_shared<EventPool>(
      [] {
        cudaEvent_t e = nullptr;
        CUBELM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        return e;
      },
      [](cudaEvent_t e) { cudaEventDestroy(e); });
}

// The NCCL work of one communicator for the watchdog: an event after every call
// made while it is armed, oldest first, one queue per stream (the caller's and the
// communication stream). The thread that talks to MPI records; the watchdog's
// thread polls (a mutex between them; the events of one stream complete in
// order, so only the oldest pending one of each queue matters).
class DeviceWatch final : public watchdog::detail::Watched {
public:
  DeviceWatch(NcclComm comm, std::shared_ptr<EventPool> events, const char* group)
      : comm_(std::move(comm)), events_(std::move(events)), group_(group) {
    CUBELM_CUDA_CHECK(cudaGetDevice(&device_));
    watchdog::detail::add(this);
  }
  ~DeviceWatch() override {
    watchdog::detail::remove(this);
    for (const Queue& q : queues_)
      for (const Entry& e : q.entries)
        events_->release(e.event);
  }
  DeviceWatch(const DeviceWatch&) = delete;
  DeviceWatch& operator=(const DeviceWatch&) = delete;

  const char* group() const { return group_; }
  ncclComm_t comm() const { return comm_.get(); }
  /// True once abort() ran: the job is ending and the communicator is gone.
  bool aborted() const { return aborted_.load(); }

  // After `op` was enqueued on `stream`; nothing at all while the watchdog is off.
  void record(const char* op, cudaStream_t stream) {
    if (!watchdog::armed())
      return;
    std::lock_guard<std::mutex> lock(mutex_);
    Queue& q = queue(stream);
    retire(q, 2); // keeps the queue as short as the work in flight
    const cudaEvent_t event = events_->acquire();
    CUBELM_CUDA_CHECK(cudaEventRecord(event, stream));
    q.entries.push_back({event, op, watchdog::detail::now_ns(), watchdog::detail::step(),
                         watchdog::detail::micro_batch()});
  }

  std::optional<watchdog::Stall> poll(double timeout_s, long long not_before) override {
    const ncclResult_t rc = async_error(comm_.get());
    std::lock_guard<std::mutex> lock(mutex_);
    if (nccl_failed(rc)) {
      const Entry* oldest = nullptr;
      for (const Queue& q : queues_)
        if (!q.entries.empty() && (oldest == nullptr || q.entries.front().since < oldest->since))
          oldest = &q.entries.front();
      return nccl_error(rc, group_, oldest == nullptr ? "a collective" : oldest->op);
    }
    cudaSetDevice(device_); // this thread's device, for the event queries
    std::optional<watchdog::Stall> worst;
    for (Queue& q : queues_) {
      retire(q, q.entries.size());
      if (q.entries.empty())
        continue;
      // Counted from when it was enqueued, or from when the work before it on its
      // stream was seen complete: time spent behind earlier work is not its own.
      const Entry& e = q.entries.front();
      const long long start = std::max({e.since, q.retired_at, not_before});
      const double waited = static_cast<double>(watchdog::detail::now_ns() - start) * 1e-9;
      if (waited <= timeout_s || (worst && worst->seconds >= waited))
        continue;
      watchdog::Stall s;
      s.group = group_;
      s.op = e.op;
      s.seconds = waited;
      s.step = e.step;
      s.micro = e.micro;
      s.timeout_s = timeout_s;
      s.where = "on the GPU (NCCL)";
      worst = s;
    }
    return worst;
  }

  void abort() noexcept override {
    if (!aborted_.exchange(true))
      ncclCommAbort(comm_.get()); // ends its kernels; the job ends next
  }

private:
  struct Entry {
    cudaEvent_t event;
    const char* op;
    long long since;
    int step;
    int micro;
  };
  struct Queue {
    cudaStream_t stream;
    std::deque<Entry> entries;
    long long retired_at = 0;
  };

  Queue& queue(cudaStream_t stream) {
    for (Queue& q : queues_)
      if (q.stream == stream)
        return q;
    queues_.push_back(Queue{stream, {}, 0});
    return queues_.back();
  }

  // Drops up to `most` completed entries from the front of `q` (mutex held).
  void retire(Queue& q, std::size_t most) {
    for (std::size_t i = 0; i < most && !q.entries.empty(); ++i) {
      const cudaError_t rc = cudaEventQuery(q.entries.front().event);
      if (rc == cudaErrorNotReady) {
        (void)cudaGetLastError(); // "not ready" is no failure
        return;
      }
      // An error here is the stream's, and the next call on it reports it.
      events_->release(q.entries.front().event);
      q.entries.pop_front();
      q.retired_at = watchdog::detail::now_ns();
    }
  }

  NcclComm comm_;
  std::shared_ptr<EventPool> events_;
  const char* group_;
  int device_ = 0;
  std::mutex mutex_;
  std::deque<Queue> queues_; // a deque: references stay valid as queues are added
  std::atomic<bool> aborted_{false};
};

// A stream-ordered NCCL operation: complete once its stream has run past the event
// recorded right after it (shared by the transfers of a batch). It is waited for by
// polling the event and NCCL's asynchronous error (an error aborts the
// communicator and the job; a timeout is the watchdog's, through the Scope of
// Request::wait). The destructor waits when nobody completed the operation.
class NcclPending final : public PendingOp {
public:
  NcclPending(std::shared_ptr<DeviceWatch> watch, std::shared_ptr<Event> done, const char* op)
      : watch_(std::move(watch)), done_event_(std::move(done)), op_(op) {}
  ~NcclPending() override {
    if (!done_)
      NcclPending::wait();
  }
  NcclPending(const NcclPending&) = delete;
  NcclPending& operator=(const NcclPending&) = delete;

  bool test() override {
    if (done_)
      return true;
    const cudaError_t rc = cudaEventQuery(done_event_->get());
    if (rc == cudaErrorNotReady) {
      (void)cudaGetLastError(); // "not ready" is no failure: do not leave it as the last error
      return false;
    }
    CUBELM_CUDA_CHECK(rc);
    done_ = true;
    return true;
  }
  void wait() override {
    while (!test()) {
      if (watch_->aborted()) // the watchdog is ending the job; the communicator is gone
        for (;;)
          std::this_thread::sleep_for(std::chrono::seconds(1));
      const ncclResult_t rc = async_error(watch_->comm());
      if (nccl_failed(rc))
        watchdog::abort_job(nccl_error(rc, watch_->group(), op_)); // aborts the communicator
      std::this_thread::yield();
    }
  }
  // The stream waits on the GPU; the event stays ours until test() or wait() sees it.
  bool enqueue_wait(void* stream) override {
    if (!done_)
      CUBELM_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), done_event_->get(), 0));
    return true;
  }

private:
  std::shared_ptr<DeviceWatch> watch_; // keeps the communicator alive
  std::shared_ptr<Event> done_event_;
  const char* op_;
  bool done_ = false;
};

// Blocking calls on the caller's stream; non-blocking ones on the communication
// stream (see the file comment), or on the caller's with `comm_stream` off.
class NcclBackend final : public Backend {
public:
  NcclBackend(const Communicator& comm, const char* group, bool comm_stream)
      : mpi_(comm), events_(make_event_pool()) {
    ncclUniqueId id;
    if (comm.rank() == 0)
      CUBELM_NCCL_CHECK(ncclGetUniqueId(&id));
    CUBELM_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm.raw()));
    ncclComm_t raw = nullptr;
    CUBELM_NCCL_CHECK(ncclCommInitRank(&raw, comm.size(), id, comm.rank()));
    comm_ = NcclComm(raw, destroy_nccl_comm);
    watch_ = std::make_shared<DeviceWatch>(comm_, events_, group);
    if (comm_stream) {
      // Non-blocking: no implicit synchronisation with the legacy default stream,
      // which a Kokkos execution space may use; only the events order it. The
      // highest priority lets its kernels start while the caller's stream is busy.
      int least = 0, greatest = 0;
      CUBELM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      CUBELM_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
      ready_ = std::make_unique<Event>(events_);
    }
  }
  ~NcclBackend() override {
    ready_.reset();
    last_async_.reset();
    if (stream_ != nullptr)
      cudaStreamDestroy(stream_); // returns at once; work still on it finishes first
  }
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  const char* name() const override { return "nccl"; }

  std::unique_ptr<PendingOp> all_reduce(const void* send, void* recv, std::size_t count,
                                        DataType type, ReduceOp op, void* stream,
                                        Mode mode) override {
    const cudaStream_t s = launch_stream(stream, mode);
    CUBELM_NCCL_CHECK(
        ncclAllReduce(send, recv, count, nccl_type(type), nccl_op(op), comm_.get(), s));
    return enqueued(s, mode, "all_reduce", "iall_reduce");
  }
  std::unique_ptr<PendingOp> all_gather(const void* send, void* recv, std::size_t count_per_rank,
                                        DataType type, void* stream, Mode mode) override {
    const cudaStream_t s = launch_stream(stream, mode);
    CUBELM_NCCL_CHECK(ncclAllGather(send, recv, count_per_rank, nccl_type(type), comm_.get(), s));
    return enqueued(s, mode, "all_gather", "iall_gather");
  }
  std::unique_ptr<PendingOp> reduce_scatter(const void* send, void* recv,
                                            std::size_t count_per_rank, DataType type, ReduceOp op,
                                            void* stream, Mode mode) override {
    const cudaStream_t s = launch_stream(stream, mode);
    CUBELM_NCCL_CHECK(ncclReduceScatter(send, recv, count_per_rank, nccl_type(type), nccl_op(op),
                                        comm_.get(), s));
    return enqueued(s, mode, "reduce_scatter", "ireduce_scatter");
  }
  // One group of a send to and a receive from every rank (itself included, which
  // NCCL serves within a group), as PyTorch's all-to-all on NCCL does; zero counts
  // are left out on both sides, which agree on them.
  std::unique_ptr<PendingOp> all_to_all(const void* send, void* recv, std::size_t count_per_rank,
                                        DataType type, void* stream, Mode mode) override {
    const std::vector<std::size_t> counts(static_cast<std::size_t>(mpi_.size()), count_per_rank);
    return exchange(send, counts, recv, counts, type, stream, mode, "all_to_all", "iall_to_all");
  }
  std::unique_ptr<PendingOp> all_to_all_v(const void* send,
                                          const std::vector<std::size_t>& send_counts, void* recv,
                                          const std::vector<std::size_t>& recv_counts,
                                          DataType type, void* stream, Mode mode) override {
    return exchange(send, send_counts, recv, recv_counts, type, stream, mode, "all_to_all_v",
                    "iall_to_all_v");
  }
  // NCCL has no tags: messages between a pair of ranks arrive in issue order.
  // On one stream, NCCL point-to-point calls run in issue order: a rank that
  // posts a send and then a receive (as its peer does) blocks its stream in the
  // send, and a ring of them deadlocks. Independent transfers need group calls:
  // start_batch. So Group routes isend/irecv through MPI and never asks for
  // Mode::nonblocking here.
  std::unique_ptr<PendingOp> send(const void* data, std::size_t count, DataType type, int peer, int,
                                  void* stream, Mode mode) override {
    if (mode == Mode::nonblocking)
      no_independent_p2p("isend");
    const cudaStream_t s = launch_stream(stream, mode);
    CUBELM_NCCL_CHECK(ncclSend(data, count, nccl_type(type), peer, comm_.get(), s));
    watch_->record("send", s);
    return nullptr;
  }
  std::unique_ptr<PendingOp> recv(void* data, std::size_t count, DataType type, int peer, int,
                                  void* stream, Mode mode) override {
    if (mode == Mode::nonblocking)
      no_independent_p2p("irecv");
    const cudaStream_t s = launch_stream(stream, mode);
    CUBELM_NCCL_CHECK(ncclRecv(data, count, nccl_type(type), peer, comm_.get(), s));
    watch_->record("recv", s);
    return nullptr;
  }
  // One group on the communication stream; every transfer completes with the
  // group's event. Tags are not used: the caller posts in matching order.
  std::vector<std::unique_ptr<PendingOp>> start_batch(const std::vector<Transfer>& batch,
                                                      void* stream) override {
    std::vector<std::unique_ptr<PendingOp>> out;
    if (batch.empty())
      return out;
    const cudaStream_t s = launch_stream(stream, Mode::nonblocking);
    CUBELM_NCCL_CHECK(ncclGroupStart());
    for (const Transfer& t : batch) {
      if (t.send)
        CUBELM_NCCL_CHECK(ncclSend(t.data, t.count, nccl_type(t.type), t.peer, comm_.get(), s));
      else
        CUBELM_NCCL_CHECK(ncclRecv(t.data, t.count, nccl_type(t.type), t.peer, comm_.get(), s));
    }
    CUBELM_NCCL_CHECK(ncclGroupEnd());
    watch_->record("exchange", s);
    const std::shared_ptr<Event> done = completion(s);
    for (const Transfer& t : batch)
      out.push_back(std::make_unique<NcclPending>(watch_, done, t.send ? "isend" : "irecv"));
    return out;
  }
  void broadcast(void* data, std::size_t count, DataType type, int root, void* stream) override {
    const cudaStream_t s = launch_stream(stream, Mode::blocking);
    CUBELM_NCCL_CHECK(ncclBroadcast(data, data, count, nccl_type(type), root, comm_.get(), s));
    watch_->record("broadcast", s);
  }
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
              void* stream) override {
    const cudaStream_t s = launch_stream(stream, Mode::blocking);
    CUBELM_NCCL_CHECK(
        ncclReduce(send, recv, count, nccl_type(type), nccl_op(op), root, comm_.get(), s));
    watch_->record("reduce", s);
  }
  void barrier() override { CUBELM_MPI_CHECK(MPI_Barrier(mpi_.raw())); }

private:
  // The stream an operation goes on. Mode::nonblocking: the communication stream,
  // after the work enqueued on the caller's stream so far (its producers, and the
  // last readers of a buffer it overwrites). Mode::blocking: the caller's stream,
  // after the non-blocking operations still in flight, so that the operations of
  // this communicator run in the order they were issued.
  cudaStream_t launch_stream(void* stream, Mode mode) {
    const cudaStream_t caller = as_stream(stream);
    if (stream_ == nullptr)
      return caller;
    if (mode == Mode::nonblocking) {
      CUBELM_CUDA_CHECK(cudaEventRecord(ready_->get(), caller));
      CUBELM_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_->get(), 0));
      return stream_;
    }
    if (last_async_ != nullptr) {
      const cudaError_t rc = cudaEventQuery(last_async_->get());
      if (rc == cudaErrorNotReady) {
        (void)cudaGetLastError();
        CUBELM_CUDA_CHECK(cudaStreamWaitEvent(caller, last_async_->get(), 0));
      } else {
        CUBELM_CUDA_CHECK(rc);
        last_async_.reset(); // done: nothing to wait for
      }
    }
    return caller;
  }
  // The blocks of an all-to-all, back to back in rank order, as one NCCL group.
  std::unique_ptr<PendingOp> exchange(const void* send, const std::vector<std::size_t>& send_counts,
                                      void* recv, const std::vector<std::size_t>& recv_counts,
                                      DataType type, void* stream, Mode mode, const char* blocking,
                                      const char* nonblocking) {
    const cudaStream_t s = launch_stream(stream, mode);
    const ncclDataType_t t = nccl_type(type);
    const std::size_t bytes = size_of(type);
    const auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    std::size_t s_at = 0, r_at = 0;
    CUBELM_NCCL_CHECK(ncclGroupStart());
    for (std::size_t peer = 0; peer < send_counts.size(); ++peer) {
      const int rank = static_cast<int>(peer);
      if (send_counts[peer] > 0)
        CUBELM_NCCL_CHECK(ncclSend(in + s_at * bytes, send_counts[peer], t, rank, comm_.get(), s));
      if (recv_counts[peer] > 0)
        CUBELM_NCCL_CHECK(ncclRecv(out + r_at * bytes, recv_counts[peer], t, rank, comm_.get(), s));
      s_at += send_counts[peer];
      r_at += recv_counts[peer];
    }
    CUBELM_NCCL_CHECK(ncclGroupEnd());
    return enqueued(s, mode, blocking, nonblocking);
  }
  // An event recorded on `s` after the operation just enqueued there.
  std::shared_ptr<Event> completion(cudaStream_t s) {
    auto done = std::make_shared<Event>(events_);
    CUBELM_CUDA_CHECK(cudaEventRecord(done->get(), s));
    if (stream_ != nullptr && s == stream_)
      last_async_ = done;
    return done;
  }
  // After a collective was enqueued on `s`: watched, and nothing to complete for a
  // blocking call (it is on the caller's stream); a non-blocking one completes with
  // the event recorded after it.
  std::unique_ptr<PendingOp> enqueued(cudaStream_t s, Mode mode, const char* blocking,
                                      const char* nonblocking) {
    const char* op = mode == Mode::blocking ? blocking : nonblocking;
    watch_->record(op, s);
    if (mode == Mode::blocking)
      return nullptr;
    return std::make_unique<NcclPending>(watch_, completion(s), op);
  }
  [[noreturn]] static void no_independent_p2p(const char* op) {
    throw InternalError(std::string("the NCCL backend has no ") + op +
                        ": non-blocking point-to-point goes through MPI or a batch");
  }

  Communicator mpi_;
  std::shared_ptr<EventPool> events_;
  NcclComm comm_;
  std::shared_ptr<DeviceWatch> watch_; // holds comm_ too
  cudaStream_t stream_ = nullptr;      // the communication stream (none: comm_stream off)
  std::unique_ptr<Event> ready_;       // recorded on the caller's stream, waited for by stream_
  std::shared_ptr<Event> last_async_;  // after the last operation on stream_
};

} // namespace

std::unique_ptr<Backend> make_nccl_backend(const Communicator& comm, const char* group,
                                           bool comm_stream) {
  return std::make_unique<NcclBackend>(comm, group, comm_stream);
}

} // namespace cubelm::comm::detail
