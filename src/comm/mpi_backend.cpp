#include "backends.hpp"

#include "cubelm/core/error.hpp"

#include <array>
#include <climits>
#include <string>
#include <vector>

namespace cubelm::comm {

std::size_t size_of(DataType type) {
  switch (type) {
  case DataType::bf16:
    return 2;
  case DataType::f32:
  case DataType::i32:
    return 4;
  case DataType::f64:
  case DataType::i64:
  case DataType::u64:
    return 8;
  case DataType::u8:
    return 1;
  }
  return 0;
}

namespace detail {
namespace {

MPI_Datatype mpi_type(DataType type) {
  switch (type) {
  case DataType::f32:
    return MPI_FLOAT;
  case DataType::f64:
    return MPI_DOUBLE;
  case DataType::i32:
    return MPI_INT32_T;
  case DataType::i64:
    return MPI_INT64_T;
  case DataType::u8:
    return MPI_UINT8_T;
  case DataType::u64:
    return MPI_UINT64_T;
  case DataType::bf16: // two bytes; reduced by the operations of bf16_op
    return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

// MPI has no bfloat16: its elements travel as MPI_UINT16_T and are reduced by user
// operations that compute in float and round the result to the nearest bfloat16, as
// NCCL's ncclBfloat16 reductions do.
template <class F>
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = bf16::from(F()(a[i].value(), b[i].value()));
}

struct Add {
  float operator()(float a, float b) const { return a + b; }
};
struct Larger {
  float operator()(float a, float b) const { return a > b ? a : b; }
};
struct Smaller {
  float operator()(float a, float b) const { return a < b ? a : b; }
};

MPI_Op bf16_op(ReduceOp op) {
  // Created on first use (after MPI_Init; a thread-safe static); MPI_Finalize frees them.
  static const std::array<MPI_Op, 3> ops = [] {
    std::array<MPI_Op, 3> o{};
    CUBELM_MPI_CHECK(MPI_Op_create(&bf16_reduce<Add>, 1, &o[0]));
    CUBELM_MPI_CHECK(MPI_Op_create(&bf16_reduce<Larger>, 1, &o[1]));
    CUBELM_MPI_CHECK(MPI_Op_create(&bf16_reduce<Smaller>, 1, &o[2]));
    return o;
  }();
  switch (op) {
  case ReduceOp::sum:
    return ops[0];
  case ReduceOp::max:
    return ops[1];
  case ReduceOp::min:
    return ops[2];
  }
  return MPI_OP_NULL;
}

MPI_Op mpi_op(ReduceOp op, DataType type) {
  if (type == DataType::bf16)
    return bf16_op(op);
  switch (op) {
  case ReduceOp::sum:
    return MPI_SUM;
  case ReduceOp::max:
    return MPI_MAX;
  case ReduceOp::min:
    return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// MPI-3 counts are int; larger messages would need the MPI-4 large-count API.
int mpi_count(std::size_t count, const char* what) {
  if (count > static_cast<std::size_t>(INT_MAX))
    throw Error(std::string("cubelm::comm ") + what + ": message of " + std::to_string(count) +
                " elements exceeds the MPI count limit of 2^31-1 elements");
  return static_cast<int>(count);
}

// One MPI request. It holds the communicator so that the communicator outlives
// the request, and waits in its destructor when nobody completed it (unless
// MPI is already finalized, when there is nothing left to wait for).
class MpiPending final : public PendingOp {
public:
  explicit MpiPending(const Communicator& comm) : comm_(comm) {}
  ~MpiPending() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      MpiPending::wait();
  }
  MpiPending(const MpiPending&) = delete;
  MpiPending& operator=(const MpiPending&) = delete;

  MPI_Request* handle() { return &request_; }
  /// Argument arrays (counts, displacements) that MPI may read until completion.
  std::vector<int>& arrays() { return arrays_; }

  // MPI_Test and MPI_Wait set a completed request to MPI_REQUEST_NULL.
  bool test() override {
    if (request_ == MPI_REQUEST_NULL)
      return true;
    int flag = 0;
    CUBELM_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL)
      CUBELM_MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE));
  }

private:
  Communicator comm_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::vector<int> arrays_;
};

class MpiBackend final : public Backend {
public:
  explicit MpiBackend(const Communicator& comm) : comm_(comm) {}
  const char* name() const override { return "mpi"; }

  // Each operation with a Mode runs the blocking MPI call in Mode::blocking and
  // the non-blocking one otherwise (never MPI_I... + MPI_Wait for a blocking
  // call: MPI libraries may reduce in a different order in the two).
  std::unique_ptr<PendingOp> all_reduce(const void* send, void* recv, std::size_t count,
                                        DataType type, ReduceOp op, void*, Mode mode) override {
    const void* in = send == recv ? MPI_IN_PLACE : send;
    const int n = mpi_count(count, mode == Mode::blocking ? "all_reduce" : "iall_reduce");
    auto pending = start(mode);
    if (mode == Mode::blocking)
      CUBELM_MPI_CHECK(MPI_Allreduce(in, recv, n, mpi_type(type), mpi_op(op, type), comm_.raw()));
    else
      CUBELM_MPI_CHECK(MPI_Iallreduce(in, recv, n, mpi_type(type), mpi_op(op, type), comm_.raw(),
                                      pending->handle()));
    return pending;
  }
  std::unique_ptr<PendingOp> all_gather(const void* send, void* recv, std::size_t count_per_rank,
                                        DataType type, void*, Mode mode) override {
    // The gathered buffer is addressed with int counts too.
    mpi_count(count_per_rank * static_cast<std::size_t>(comm_.size()),
              mode == Mode::blocking ? "all_gather" : "iall_gather");
    const int c = static_cast<int>(count_per_rank);
    const MPI_Datatype t = mpi_type(type);
    auto pending = start(mode);
    if (mode == Mode::blocking)
      CUBELM_MPI_CHECK(MPI_Allgather(send, c, t, recv, c, t, comm_.raw()));
    else
      CUBELM_MPI_CHECK(MPI_Iallgather(send, c, t, recv, c, t, comm_.raw(), pending->handle()));
    return pending;
  }
  std::unique_ptr<PendingOp> reduce_scatter(const void* send, void* recv,
                                            std::size_t count_per_rank, DataType type, ReduceOp op,
                                            void*, Mode mode) override {
    mpi_count(count_per_rank * static_cast<std::size_t>(comm_.size()),
              mode == Mode::blocking ? "reduce_scatter" : "ireduce_scatter");
    const int c = static_cast<int>(count_per_rank);
    auto pending = start(mode);
    if (mode == Mode::blocking)
      CUBELM_MPI_CHECK(
          MPI_Reduce_scatter_block(send, recv, c, mpi_type(type), mpi_op(op, type), comm_.raw()));
    else
      CUBELM_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, c, mpi_type(type), mpi_op(op, type),
                                                 comm_.raw(), pending->handle()));
    return pending;
  }
  std::unique_ptr<PendingOp> all_to_all(const void* send, void* recv, std::size_t count_per_rank,
                                        DataType type, void*, Mode mode) override {
    mpi_count(count_per_rank * static_cast<std::size_t>(comm_.size()),
              mode == Mode::blocking ? "all_to_all" : "iall_to_all");
    const int c = static_cast<int>(count_per_rank);
    const MPI_Datatype t = mpi_type(type);
    auto pending = start(mode);
    if (mode == Mode::blocking)
      CUBELM_MPI_CHECK(MPI_Alltoall(send, c, t, recv, c, t, comm_.raw()));
    else
      CUBELM_MPI_CHECK(MPI_Ialltoall(send, c, t, recv, c, t, comm_.raw(), pending->handle()));
    return pending;
  }
  std::unique_ptr<PendingOp> all_to_all_v(const void* send,
                                          const std::vector<std::size_t>& send_counts, void* recv,
                                          const std::vector<std::size_t>& recv_counts,
                                          DataType type, void*, Mode mode) override {
    const char* what = mode == Mode::blocking ? "all_to_all_v" : "iall_to_all_v";
    const std::size_t p = static_cast<std::size_t>(comm_.size());
    // Counts and displacements of send, then of recv; a non-blocking call keeps them
    // in its request, since MPI may read them until the operation completes.
    auto pending = start(mode);
    std::vector<int> local;
    std::vector<int>& a = pending ? pending->arrays() : local;
    a.resize(4 * p);
    int* const sc = a.data();
    int* const sd = sc + p;
    int* const rc = sd + p;
    int* const rd = rc + p;
    std::size_t s_end = 0, r_end = 0;
    for (std::size_t i = 0; i < p; ++i) {
      sd[i] = mpi_count(s_end, what);
      sc[i] = static_cast<int>(send_counts[i]);
      s_end += send_counts[i];
      rd[i] = mpi_count(r_end, what);
      rc[i] = static_cast<int>(recv_counts[i]);
      r_end += recv_counts[i];
    }
    // Every displacement and count is below the totals, so these bound them all.
    mpi_count(s_end, what);
    mpi_count(r_end, what);
    const MPI_Datatype t = mpi_type(type);
    if (mode == Mode::blocking)
      CUBELM_MPI_CHECK(MPI_Alltoallv(send, sc, sd, t, recv, rc, rd, t, comm_.raw()));
    else
      CUBELM_MPI_CHECK(
          MPI_Ialltoallv(send, sc, sd, t, recv, rc, rd, t, comm_.raw(), pending->handle()));
    return pending;
  }
  std::unique_ptr<PendingOp> send(const void* data, std::size_t count, DataType type, int peer,
                                  int tag, void*, Mode mode) override {
    const int n = mpi_count(count, mode == Mode::blocking ? "send" : "isend");
    auto pending = start(mode);
    if (mode == Mode::blocking)
      CUBELM_MPI_CHECK(MPI_Send(data, n, mpi_type(type), peer, tag, comm_.raw()));
    else
      CUBELM_MPI_CHECK(
          MPI_Isend(data, n, mpi_type(type), peer, tag, comm_.raw(), pending->handle()));
    return pending;
  }
  std::unique_ptr<PendingOp> recv(void* data, std::size_t count, DataType type, int peer, int tag,
                                  void*, Mode mode) override {
    const int n = mpi_count(count, mode == Mode::blocking ? "recv" : "irecv");
    auto pending = start(mode);
    if (mode == Mode::blocking)
      CUBELM_MPI_CHECK(
          MPI_Recv(data, n, mpi_type(type), peer, tag, comm_.raw(), MPI_STATUS_IGNORE));
    else
      CUBELM_MPI_CHECK(
          MPI_Irecv(data, n, mpi_type(type), peer, tag, comm_.raw(), pending->handle()));
    return pending;
  }
  // Each transfer on its own, in the order given (with equal tags, MPI matches the
  // messages between two ranks in the order they were posted).
  std::vector<std::unique_ptr<PendingOp>> start_batch(const std::vector<Transfer>& batch,
                                                      void*) override {
    std::vector<std::unique_ptr<PendingOp>> out;
    out.reserve(batch.size());
    for (const Transfer& t : batch)
      out.push_back(t.send
                        ? send(t.data, t.count, t.type, t.peer, t.tag, nullptr, Mode::nonblocking)
                        : recv(t.data, t.count, t.type, t.peer, t.tag, nullptr, Mode::nonblocking));
    return out;
  }
  void broadcast(void* data, std::size_t count, DataType type, int root, void*) override {
    CUBELM_MPI_CHECK(
        MPI_Bcast(data, mpi_count(count, "broadcast"), mpi_type(type), root, comm_.raw()));
  }
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
              void*) override {
    const void* in = send == recv && comm_.rank() == root ? MPI_IN_PLACE : send;
    CUBELM_MPI_CHECK(MPI_Reduce(in, recv, mpi_count(count, "reduce"), mpi_type(type),
                                mpi_op(op, type), root, comm_.raw()));
  }
  void barrier() override { CUBELM_MPI_CHECK(MPI_Barrier(comm_.raw())); }

private:
  // The request of a non-blocking call; none for a blocking one.
  std::unique_ptr<MpiPending> start(Mode mode) const {
    return mode == Mode::nonblocking ? std::make_unique<MpiPending>(comm_) : nullptr;
  }

  Communicator comm_;
};

} // namespace

std::unique_ptr<Backend> make_mpi_backend(const Communicator& comm) {
  return std::make_unique<MpiBackend>(comm);
}

} // namespace detail
} // namespace cubelm::comm
