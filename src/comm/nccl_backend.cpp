#include "backends.hpp"

#include "cubelm/core/error.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

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

// Every call is enqueued on the execution space's stream, so it is ordered
// with the Kokkos kernels that produce and consume its buffers.
class NcclBackend final : public Backend {
public:
  explicit NcclBackend(const Communicator& comm) : mpi_(comm) {
    ncclUniqueId id;
    if (comm.rank() == 0)
      CUBELM_NCCL_CHECK(ncclGetUniqueId(&id));
    CUBELM_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm.raw()));
    CUBELM_NCCL_CHECK(ncclCommInitRank(&comm_, comm.size(), id, comm.rank()));
  }
  ~NcclBackend() override {
    if (comm_ != nullptr)
      ncclCommDestroy(comm_);
  }
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  const char* name() const override { return "nccl"; }

  void all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                  void* stream) override {
    CUBELM_NCCL_CHECK(
        ncclAllReduce(send, recv, count, nccl_type(type), nccl_op(op), comm_, as_stream(stream)));
  }
  void all_gather(const void* send, void* recv, std::size_t count_per_rank, DataType type,
                  void* stream) override {
    CUBELM_NCCL_CHECK(
        ncclAllGather(send, recv, count_per_rank, nccl_type(type), comm_, as_stream(stream)));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count_per_rank, DataType type,
                      ReduceOp op, void* stream) override {
    CUBELM_NCCL_CHECK(ncclReduceScatter(send, recv, count_per_rank, nccl_type(type), nccl_op(op),
                                        comm_, as_stream(stream)));
  }
  void broadcast(void* data, std::size_t count, DataType type, int root, void* stream) override {
    CUBELM_NCCL_CHECK(
        ncclBroadcast(data, data, count, nccl_type(type), root, comm_, as_stream(stream)));
  }
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
              void* stream) override {
    CUBELM_NCCL_CHECK(ncclReduce(send, recv, count, nccl_type(type), nccl_op(op), root, comm_,
                                 as_stream(stream)));
  }
  // NCCL has no tags: messages between a pair of ranks arrive in issue order.
  void send(const void* data, std::size_t count, DataType type, int peer, int,
            void* stream) override {
    CUBELM_NCCL_CHECK(ncclSend(data, count, nccl_type(type), peer, comm_, as_stream(stream)));
  }
  void recv(void* data, std::size_t count, DataType type, int peer, int, void* stream) override {
    CUBELM_NCCL_CHECK(ncclRecv(data, count, nccl_type(type), peer, comm_, as_stream(stream)));
  }
  void barrier() override { CUBELM_MPI_CHECK(MPI_Barrier(mpi_.raw())); }

private:
  Communicator mpi_;
  ncclComm_t comm_ = nullptr;
};

} // namespace

std::unique_ptr<Backend> make_nccl_backend(const Communicator& comm) {
  return std::make_unique<NcclBackend>(comm);
}

} // namespace cubelm::comm::detail
