#pragma once
/// \file
/// \brief Checkpoints written by a thread while training goes on (checkpoint.async,
/// docs/training.md#background-checkpoints).
///
/// At a checkpoint step the thread that runs the model copies what the checkpoint holds
/// into host buffers (CheckpointSnapshot::take) and hands them to a writer thread,
/// which writes and commits the same file a synchronous save writes, collectively over
/// a communicator of its own (MPI_THREAD_MULTIPLE), watched by the hang watchdog as
/// group "checkpoint". At most one write is in flight. The previous checkpoint is never
/// touched: a file is written as "<path>.partial" and renamed when every rank's part is
/// in it, and older checkpoints are pruned after that.
///
/// HDF5 is not thread-safe: while a write is in flight no other thread of the process
/// may call HDF5 (the trainer waits for the write before anything else touches a
/// checkpoint).

#include "cubelm/comm/communicator.hpp"
#include "cubelm/train/checkpointing.hpp"
#include "cubelm/train/metrics.hpp"

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace cubelm::train {

/// \brief One writer thread per rank, one write at a time.
class BackgroundSaves {
public:
  /// \brief Collective over `comm` (duplicates it for the writer). MPI must run at
  /// MPI_THREAD_MULTIPLE (comm::threads_may_call_mpi()): an InternalError otherwise.
  explicit BackgroundSaves(const comm::Communicator& comm);
  /// \brief Waits for the write in flight, if any (its result is lost: call wait() first
  /// to learn it).
  ~BackgroundSaves();
  BackgroundSaves(const BackgroundSaves&) = delete;
  BackgroundSaves& operator=(const BackgroundSaves&) = delete;

  /// \brief Where take() copies to; the writer reads it while a write is in flight, so
  /// it must not be taken again before wait().
  CheckpointSnapshot& snapshot() { return snapshot_; }
  /// \brief Starts writing snapshot() to `path` on every rank (collective in effect: the
  /// writers of all ranks write one file together); `after_commit` runs on the writer
  /// thread after the commit (rank 0 prunes older checkpoints there: files only, no MPI,
  /// no Kokkos). A write must not be in flight.
  void start(const std::string& path, std::function<void()> after_commit);
  /// \brief A write was started and not yet waited for.
  bool in_flight() const { return thread_.joinable(); }
  /// \brief This rank's writer is still writing (false once it has finished, even before wait()).
  bool running() const { return thread_.joinable() && !finished_.load(std::memory_order_acquire); }
  /// \brief Waits for this rank's writer and returns what became of the write (an
  /// InternalError when none is in flight).
  BackgroundResult wait();
  /// \brief This rank's writer finished and its write failed (false while it runs).
  bool failed() const { return in_flight() && !running() && !result_.error.empty(); }

private:
  comm::Communicator comm_;
  CheckpointSnapshot snapshot_;
  std::thread thread_;
  std::atomic<bool> finished_{false};
  BackgroundResult result_;
};

} // namespace cubelm::train
