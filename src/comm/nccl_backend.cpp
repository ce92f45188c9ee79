// NCCL on device memory, watched for hangs (docs/reliability.md, "Hang watchdog"):
// an NCCL call returns once enqueued, and a collective that never completes
// blocks whatever waits for its stream later, often a fence outside comm. So
// while the watchdog is armed every call is followed by an event that the
// watchdog's thread polls (DeviceWatch), with NCCL's asynchronous error; a
// Request waits by polling its event and that error instead of blocking in
// cudaEventSynchronize. On a timeout or an error the communicator is aborted
// (ncclCommAbort, which ends its kernels) before the job is.

#include "backends.hpp"
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

// The NCCL work of one communicator for the watchdog: an event after every call
// made while it is armed, oldest first. The thread that talks to MPI records;
// the watchdog's thread polls (a mutex between them; the events complete in
// stream order, so only the oldest pending one matters).
class DeviceWatch final : public watchdog::detail::Watched {
public:
  DeviceWatch(NcclComm comm, const char* group) : comm_(std::move(comm)), group_(group) {
    CUBELM_CUDA_CHECK(cudaGetDevice(&device_));
    watchdog::detail::add(this);
  }
  ~DeviceWatch() override {
    watchdog::detail::remove(this);
    for (const Entry& e : queue_)
      cudaEventDestroy(e.event);
    for (cudaEvent_t e : spare_)
      cudaEventDestroy(e);
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
    retire(2); // keeps the queue as short as the work in flight
    cudaEvent_t event = nullptr;
    if (spare_.empty()) {
      CUBELM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    } else {
      event = spare_.back();
      spare_.pop_back();
    }
    CUBELM_CUDA_CHECK(cudaEventRecord(event, stream));
    queue_.push_back({event, op, watchdog::detail::now_ns(), watchdog::detail::step(),
                      watchdog::detail::micro_batch()});
  }

  std::optional<watchdog::Stall> poll(double timeout_s, long long not_before) override {
    const ncclResult_t rc = async_error(comm_.get());
    if (nccl_failed(rc)) {
      std::lock_guard<std::mutex> lock(mutex_);
      return nccl_error(rc, group_, queue_.empty() ? "a collective" : queue_.front().op);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    cudaSetDevice(device_); // this thread's device, for the event queries
    retire(queue_.size());
    if (queue_.empty())
      return std::nullopt;
    // Counted from when it was enqueued, or from when the work before it was seen
    // complete: time spent behind earlier work on the stream is not its own.
    const Entry& e = queue_.front();
    const long long start = std::max({e.since, retired_at_, not_before});
    const double waited = static_cast<double>(watchdog::detail::now_ns() - start) * 1e-9;
    if (waited <= timeout_s)
      return std::nullopt;
    watchdog::Stall s;
    s.group = group_;
    s.op = e.op;
    s.seconds = waited;
    s.step = e.step;
    s.micro = e.micro;
    s.timeout_s = timeout_s;
    s.where = "on the GPU (NCCL)";
    return s;
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

  // Drops up to `most` completed entries from the front (mutex held).
  void retire(std::size_t most) {
    for (std::size_t i = 0; i < most && !queue_.empty(); ++i) {
      const cudaError_t rc = cudaEventQuery(queue_.front().event);
      if (rc == cudaErrorNotReady) {
        (void)cudaGetLastError(); // "not ready" is no failure
        return;
      }
      // An error here is the stream's, and the next call on it reports it.
      spare_.push_back(queue_.front().event);
      queue_.pop_front();
      retired_at_ = watchdog::detail::now_ns();
    }
  }

  NcclComm comm_;
  const char* group_;
  int device_ = 0;
  std::mutex mutex_;
  std::deque<Entry> queue_;
  std::vector<cudaEvent_t> spare_;
  long long retired_at_ = 0;
  std::atomic<bool> aborted_{false};
};

// A stream-ordered NCCL call: complete once the stream has run past the event
// recorded right after it. It is waited for by polling the event and NCCL's
// asynchronous error (an error aborts the communicator and the job; a timeout
// is the watchdog's, through the Scope of Request::wait). The destructor waits
// when nobody completed the operation.
class NcclPending final : public PendingOp {
public:
  NcclPending(std::shared_ptr<DeviceWatch> watch, cudaStream_t stream, const char* op)
      : watch_(std::move(watch)), op_(op) {
    CUBELM_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    CUBELM_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~NcclPending() override {
    if (event_ == nullptr)
      return;
    NcclPending::wait();
    cudaEventDestroy(event_);
  }
  NcclPending(const NcclPending&) = delete;
  NcclPending& operator=(const NcclPending&) = delete;

  bool test() override {
    if (done_)
      return true;
    const cudaError_t rc = cudaEventQuery(event_);
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

private:
  std::shared_ptr<DeviceWatch> watch_; // keeps the communicator alive
  const char* op_;
  cudaEvent_t event_ = nullptr;
  bool done_ = false;
};

// Every call is enqueued on the execution space's stream, so it is ordered
// with the Kokkos kernels that produce and consume its buffers. In
// Mode::nonblocking a collective is the same call followed by an event.
class NcclBackend final : public Backend {
public:
  NcclBackend(const Communicator& comm, const char* group) : mpi_(comm) {
    ncclUniqueId id;
    if (comm.rank() == 0)
      CUBELM_NCCL_CHECK(ncclGetUniqueId(&id));
    CUBELM_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm.raw()));
    ncclComm_t raw = nullptr;
    CUBELM_NCCL_CHECK(ncclCommInitRank(&raw, comm.size(), id, comm.rank()));
    comm_ = NcclComm(raw, destroy_nccl_comm);
    watch_ = std::make_shared<DeviceWatch>(comm_, group);
  }

  const char* name() const override { return "nccl"; }

  std::unique_ptr<PendingOp> all_reduce(const void* send, void* recv, std::size_t count,
                                        DataType type, ReduceOp op, void* stream,
                                        Mode mode) override {
    CUBELM_NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type(type), nccl_op(op), comm_.get(),
                                    as_stream(stream)));
    return enqueued(stream, mode, "all_reduce", "iall_reduce");
  }
  std::unique_ptr<PendingOp> all_gather(const void* send, void* recv, std::size_t count_per_rank,
                                        DataType type, void* stream, Mode mode) override {
    CUBELM_NCCL_CHECK(
        ncclAllGather(send, recv, count_per_rank, nccl_type(type), comm_.get(), as_stream(stream)));
    return enqueued(stream, mode, "all_gather", "iall_gather");
  }
  std::unique_ptr<PendingOp> reduce_scatter(const void* send, void* recv,
                                            std::size_t count_per_rank, DataType type, ReduceOp op,
                                            void* stream, Mode mode) override {
    CUBELM_NCCL_CHECK(ncclReduceScatter(send, recv, count_per_rank, nccl_type(type), nccl_op(op),
                                        comm_.get(), as_stream(stream)));
    return enqueued(stream, mode, "reduce_scatter", "ireduce_scatter");
  }
  // NCCL has no tags: messages between a pair of ranks arrive in issue order.
  // On one stream, NCCL point-to-point calls run in issue order: a rank that
  // posts a send and then a receive (as its peer does) blocks its stream in the
  // send, and a ring of them deadlocks. Expressing independent transfers needs
  // group calls, so Group routes isend/irecv through MPI and never asks for
  // Mode::nonblocking here.
  std::unique_ptr<PendingOp> send(const void* data, std::size_t count, DataType type, int peer, int,
                                  void* stream, Mode mode) override {
    if (mode == Mode::nonblocking)
      no_independent_p2p("isend");
    CUBELM_NCCL_CHECK(ncclSend(data, count, nccl_type(type), peer, comm_.get(), as_stream(stream)));
    watch_->record("send", as_stream(stream));
    return nullptr;
  }
  std::unique_ptr<PendingOp> recv(void* data, std::size_t count, DataType type, int peer, int,
                                  void* stream, Mode mode) override {
    if (mode == Mode::nonblocking)
      no_independent_p2p("irecv");
    CUBELM_NCCL_CHECK(ncclRecv(data, count, nccl_type(type), peer, comm_.get(), as_stream(stream)));
    watch_->record("recv", as_stream(stream));
    return nullptr;
  }
  void broadcast(void* data, std::size_t count, DataType type, int root, void* stream) override {
    CUBELM_NCCL_CHECK(
        ncclBroadcast(data, data, count, nccl_type(type), root, comm_.get(), as_stream(stream)));
    watch_->record("broadcast", as_stream(stream));
  }
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
              void* stream) override {
    CUBELM_NCCL_CHECK(ncclReduce(send, recv, count, nccl_type(type), nccl_op(op), root, comm_.get(),
                                 as_stream(stream)));
    watch_->record("reduce", as_stream(stream));
  }
  void barrier() override { CUBELM_MPI_CHECK(MPI_Barrier(mpi_.raw())); }

private:
  // After a collective was enqueued: watched, and nothing to complete for a
  // blocking call (it is on the stream); a non-blocking one completes with the
  // event recorded after it.
  std::unique_ptr<PendingOp> enqueued(void* stream, Mode mode, const char* blocking,
                                      const char* nonblocking) const {
    const char* op = mode == Mode::blocking ? blocking : nonblocking;
    watch_->record(op, as_stream(stream));
    if (mode == Mode::blocking)
      return nullptr;
    return std::make_unique<NcclPending>(watch_, as_stream(stream), op);
  }
  [[noreturn]] static void no_independent_p2p(const char* op) {
    throw InternalError(std::string("the NCCL backend has no ") + op +
                        ": non-blocking point-to-point goes through MPI");
  }

  Communicator mpi_;
  NcclComm comm_;
  std::shared_ptr<DeviceWatch> watch_; // holds comm_ too
};

} // namespace

std::unique_ptr<Backend> make_nccl_backend(const Communicator& comm, const char* group) {
  return std::make_unique<NcclBackend>(comm, group);
}

} // namespace cubelm::comm::detail
