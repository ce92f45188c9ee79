#include "backends.hpp"

#include "cubelm/core/error.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <type_traits>

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

// A stream-ordered NCCL call: complete once the stream has run past the event
// recorded right after it. The event is waited for in the destructor when
// nobody completed the operation.
class NcclPending final : public PendingOp {
public:
  NcclPending(NcclComm comm, cudaStream_t stream) : comm_(std::move(comm)) {
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
    if (done_)
      return;
    CUBELM_CUDA_CHECK(cudaEventSynchronize(event_));
    done_ = true;
  }

private:
  NcclComm comm_;
  cudaEvent_t event_ = nullptr;
  bool done_ = false;
};

// Every call is enqueued on the execution space's stream, so it is ordered
// with the Kokkos kernels that produce and consume its buffers. In
// Mode::nonblocking a collective is the same call followed by an event.
class NcclBackend final : public Backend {
public:
  explicit NcclBackend(const Communicator& comm) : mpi_(comm) {
    ncclUniqueId id;
    if (comm.rank() == 0)
      CUBELM_NCCL_CHECK(ncclGetUniqueId(&id));
    CUBELM_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm.raw()));
    ncclComm_t raw = nullptr;
    CUBELM_NCCL_CHECK(ncclCommInitRank(&raw, comm.size(), id, comm.rank()));
    comm_ = NcclComm(raw, destroy_nccl_comm);
  }

  const char* name() const override { return "nccl"; }

  std::unique_ptr<PendingOp> all_reduce(const void* send, void* recv, std::size_t count,
                                        DataType type, ReduceOp op, void* stream,
                                        Mode mode) override {
    CUBELM_NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type(type), nccl_op(op), comm_.get(),
                                    as_stream(stream)));
    return pending(stream, mode);
  }
  std::unique_ptr<PendingOp> all_gather(const void* send, void* recv, std::size_t count_per_rank,
                                        DataType type, void* stream, Mode mode) override {
    CUBELM_NCCL_CHECK(
        ncclAllGather(send, recv, count_per_rank, nccl_type(type), comm_.get(), as_stream(stream)));
    return pending(stream, mode);
  }
  std::unique_ptr<PendingOp> reduce_scatter(const void* send, void* recv,
                                            std::size_t count_per_rank, DataType type, ReduceOp op,
                                            void* stream, Mode mode) override {
    CUBELM_NCCL_CHECK(ncclReduceScatter(send, recv, count_per_rank, nccl_type(type), nccl_op(op),
                                        comm_.get(), as_stream(stream)));
    return pending(stream, mode);
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
    return nullptr;
  }
  std::unique_ptr<PendingOp> recv(void* data, std::size_t count, DataType type, int peer, int,
                                  void* stream, Mode mode) override {
    if (mode == Mode::nonblocking)
      no_independent_p2p("irecv");
    CUBELM_NCCL_CHECK(ncclRecv(data, count, nccl_type(type), peer, comm_.get(), as_stream(stream)));
    return nullptr;
  }
  void broadcast(void* data, std::size_t count, DataType type, int root, void* stream) override {
    CUBELM_NCCL_CHECK(
        ncclBroadcast(data, data, count, nccl_type(type), root, comm_.get(), as_stream(stream)));
  }
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
              void* stream) override {
    CUBELM_NCCL_CHECK(ncclReduce(send, recv, count, nccl_type(type), nccl_op(op), root, comm_.get(),
                                 as_stream(stream)));
  }
  void barrier() override { CUBELM_MPI_CHECK(MPI_Barrier(mpi_.raw())); }

private:
  // Nothing to complete for a blocking call (it is on the stream); a
  // non-blocking one completes with the event recorded after it.
  std::unique_ptr<PendingOp> pending(void* stream, Mode mode) const {
    if (mode == Mode::blocking)
      return nullptr;
    return std::make_unique<NcclPending>(comm_, as_stream(stream));
  }
  [[noreturn]] static void no_independent_p2p(const char* op) {
    throw InternalError(std::string("the NCCL backend has no ") + op +
                        ": non-blocking point-to-point goes through MPI");
  }

  Communicator mpi_;
  NcclComm comm_;
};

} // namespace

std::unique_ptr<Backend> make_nccl_backend(const Communicator& comm) {
  return std::make_unique<NcclBackend>(comm);
}

} // namespace cubelm::comm::detail
