#pragma once
/// \file
/// \brief The interface a collective backend (MPI, NCCL) implements on raw buffers.
///
/// Groups turn Kokkos Views into (pointer, count, type) and pick a backend by
/// where the memory lives; backends know nothing of Views.

#include "cubelm/core/bf16.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

namespace cubelm::comm {

/// \brief Element types the collectives move (bf16: cubelm::bf16, reduced in float).
enum class DataType { f32, f64, i32, i64, u8, u64, bf16 };

/// \brief Reductions the collectives apply.
enum class ReduceOp { sum, max, min };

/// \brief Bytes of one element of `type`.
std::size_t size_of(DataType type);

/// \brief The DataType of a C++ scalar (compile error for others).
template <class T>
constexpr DataType data_type_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return DataType::f32;
  else if constexpr (std::is_same_v<U, double>)
    return DataType::f64;
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return DataType::i32;
  else if constexpr (std::is_same_v<U, std::int64_t>)
    return DataType::i64;
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return DataType::u8;
  else if constexpr (std::is_same_v<U, std::uint64_t>)
    return DataType::u64;
  else if constexpr (std::is_same_v<U, bf16>)
    return DataType::bf16;
  else
    static_assert(sizeof(U) == 0, "cubelm::comm: unsupported element type for a collective");
}

/// \brief A backend operation in flight; Group wraps it in a cubelm::comm::Request.
///
/// test() and wait() complete the operation in the library (MPI_Test/MPI_Wait,
/// or the CUDA event behind a stream-ordered NCCL call); either may be called
/// again after completion and then returns at once. An implementation waits
/// in its destructor when the operation is still pending, so no library
/// handle (MPI_Request, cudaEvent_t) ever leaks.
class PendingOp {
public:
  virtual ~PendingOp() = default;
  /// \brief True when the operation is complete (completing it), false while in flight.
  virtual bool test() = 0;
  /// \brief Blocks until the operation is complete.
  virtual void wait() = 0;
  /// \brief Makes the work enqueued on `stream` from now on wait for the operation,
  /// without blocking the host, and returns true; false when the operation is not
  /// on a stream (MPI): the caller then waits on the host. The operation itself
  /// stays pending until test() or wait() complete it.
  virtual bool enqueue_wait(void* stream) {
    (void)stream;
    return false;
  }
};

/// \brief How a Backend runs an operation that has a non-blocking twin.
///
/// `blocking` runs the library's blocking call (MPI_Allreduce, MPI_Send, ...;
/// a stream-ordered backend enqueues it on `stream`) and returns no PendingOp.
/// `nonblocking` starts the non-blocking call (MPI_Iallreduce, MPI_Isend, ...;
/// a stream-ordered backend enqueues the same call on its communication stream,
/// after the work enqueued on `stream` so far, and records an event after it) and
/// returns the PendingOp that completes it; until then the buffers must stay
/// untouched (send) or unread (recv). The two modes are separate library calls
/// on purpose: an MPI library may reduce in a different order in its blocking
/// and its non-blocking collectives, and a blocking reduction must give the
/// same bits whether or not a non-blocking twin exists.
enum class Mode { blocking, nonblocking };

/// \brief One transfer of a batch of point-to-point operations (Backend::start_batch).
struct Transfer {
  bool send = true;      ///< a send of `data` to `peer`, else a receive into it
  void* data = nullptr;  ///< a buffer the backend can use (device memory for NCCL)
  std::size_t count = 0; ///< elements
  DataType type = DataType::f32;
  int peer = 0; ///< group rank
  int tag = 0;  ///< MPI's tag; NCCL has none (see start_batch)
};

/// \brief One transport for the collectives of one group.
///
/// Counts are in elements. `stream` is the native stream of the execution
/// space (nullptr on the host); stream-ordered backends enqueue blocking calls
/// on it and order their non-blocking ones after it (on a communication stream
/// of their own, see nccl_backend.cpp), the others expect the caller to have
/// fenced. Buffers must not overlap unless `send == recv` where an operation
/// allows in-place use (all_reduce). Operations taking a Mode return nullptr in
/// Mode::blocking.
class Backend {
public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual std::unique_ptr<PendingOp> all_reduce(const void* send, void* recv, std::size_t count,
                                                DataType type, ReduceOp op, void* stream,
                                                Mode mode) = 0;
  virtual std::unique_ptr<PendingOp> all_gather(const void* send, void* recv,
                                                std::size_t count_per_rank, DataType type,
                                                void* stream, Mode mode) = 0;
  virtual std::unique_ptr<PendingOp> reduce_scatter(const void* send, void* recv,
                                                    std::size_t count_per_rank, DataType type,
                                                    ReduceOp op, void* stream, Mode mode) = 0;
  /// \brief Block j of `send` (count_per_rank elements at j · count_per_rank) to group
  /// rank j, block i of `recv` from group rank i.
  virtual std::unique_ptr<PendingOp> all_to_all(const void* send, void* recv,
                                                std::size_t count_per_rank, DataType type,
                                                void* stream, Mode mode) = 0;
  /// \brief all_to_all with a count per peer (size() entries each, possibly 0): the
  /// blocks lie back to back in group-rank order (displacements are the prefix sums
  /// of the counts). recv_counts[i] must equal send_counts[rank()] of rank i.
  virtual std::unique_ptr<PendingOp> all_to_all_v(const void* send,
                                                  const std::vector<std::size_t>& send_counts,
                                                  void* recv,
                                                  const std::vector<std::size_t>& recv_counts,
                                                  DataType type, void* stream, Mode mode) = 0;
  virtual std::unique_ptr<PendingOp> send(const void* data, std::size_t count, DataType type,
                                          int peer, int tag, void* stream, Mode mode) = 0;
  virtual std::unique_ptr<PendingOp> recv(void* data, std::size_t count, DataType type, int peer,
                                          int tag, void* stream, Mode mode) = 0;
  /// \brief Starts every transfer of `batch` together and returns one PendingOp per
  /// transfer, in order. MPI: MPI_Isend and MPI_Irecv, matched by tag, each completing
  /// on its own. Stream-ordered (NCCL): one group call (ncclGroupStart, the ncclSend and
  /// ncclRecv calls, ncclGroupEnd) ordered after the work enqueued on `stream` so far;
  /// no tags: transfers between two ranks match in the order they are posted, and
  /// the batch completes as a whole (every PendingOp completes with the last transfer).
  virtual std::vector<std::unique_ptr<PendingOp>> start_batch(const std::vector<Transfer>& batch,
                                                              void* stream) = 0;
  virtual void broadcast(void* data, std::size_t count, DataType type, int root, void* stream) = 0;
  virtual void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                      int root, void* stream) = 0;
  virtual void barrier() = 0;
};

} // namespace cubelm::comm
