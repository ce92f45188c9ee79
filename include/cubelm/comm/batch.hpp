#pragma once
/// \file
/// \brief Point-to-point transfers of one group posted together, as a pipeline
/// stage posts the sends and receives of one step (docs/communication.md,
/// "Batches of point-to-point transfers").
///
///   comm::Batch batch(pp, comm::Matching::in_order);
///   batch.send(output, next);
///   batch.recv(input, prev);
///   std::vector<comm::Request> done = batch.post(exec);
///
/// Each transfer takes the checks and traffic accounting of isend and irecv
/// (counted when posted, as Kind::send and Kind::recv) and gets a Request of its
/// own. Routes:
///  - host memory, and device memory with Matching::by_tag or NCCL off: MPI_Isend
///    and MPI_Irecv, each completing on its own (device memory directly with
///    GPU-aware MPI, else staged through a host copy), as isend and irecv;
///  - device memory with Matching::in_order and NCCL on: one NCCL group
///    (ncclGroupStart, ncclSend/ncclRecv..., ncclGroupEnd) on the group's
///    communication stream, ordered after the work enqueued on `exec` so far; all
///    its Requests complete together, when the last transfer has.
/// NCCL has no tags. With Matching::in_order the k-th send from one rank to
/// another matches the k-th receive that rank posts from it, on every route (MPI
/// gets one tag, kInOrderTag, for all of them, and matches in posting order too),
/// so the CPU build checks the order that NCCL relies on. The caller must also
/// make sure that, when each rank's batches complete one after the other and as a
/// whole (a send completing only once its receiver has posted), every batch
/// completes: pipeline::plan_exchanges does that for the pipeline.

#include "cubelm/comm/group.hpp"

#include <functional>
#include <type_traits>
#include <vector>

namespace cubelm::comm {

/// \brief How the transfers of a Batch find their partners.
enum class Matching {
  /// By tag, in any order: always MPI (device memory as isend/irecv).
  by_tag,
  /// In posting order per pair of ranks, tags unused: NCCL for device memory when on.
  in_order,
};

/// \brief The MPI tag of every transfer of an in-order Batch (within the 32767 that
/// every MPI library allows).
constexpr int kInOrderTag = 32767;

/// \brief Sends and receives of one group, added one by one and posted together.
class Batch {
public:
  Batch(const Group& group, Matching matching) : group_(group), matching_(matching) {}
  /// \brief Transfers added and never posted are dropped: nothing was sent.
  ~Batch() = default;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  /// \brief Adds a send of `data` to group rank `peer` (`tag` only with Matching::by_tag).
  template <class V>
  void send(const V& data, int peer, int tag = 0) {
    add(data, peer, tag, true);
  }
  /// \brief Adds a receive into `data` from group rank `peer`.
  template <class V>
  void recv(const V& data, int peer, int tag = 0) {
    static_assert(!std::is_const_v<typename V::value_type>, "recv needs a writable View");
    add(data, peer, tag, false);
  }
  /// \brief Transfers added since the last post().
  std::size_t size() const { return entries_.size(); }

  /// \brief Posts every transfer added, together, and returns their Requests in the
  /// order they were added. Transfers through MPI fence `exec` first (their buffers'
  /// producers are done); NCCL's are ordered after `exec`'s stream by an event.
  template <class Exec>
  [[nodiscard]] std::vector<Request> post(const Exec& exec) {
    if (entries_.empty())
      return {};
    if (needs_fence())
      exec.fence();
    return post_entries(compat::native_stream(exec));
  }

private:
  struct Entry {
    Transfer transfer;
    Group::Route route;
    std::size_t bytes;
    std::function<void()> copy_in; // a staged send: the View into its host copy
    std::function<void()> finish;  // on completion: a staged receive back; holds the View
  };

  template <class V>
  void add(const V& data, int peer, int tag, bool sending) {
    add(detail::buffer_of(data, group_.name(), sending ? "isend" : "irecv", true), peer, tag,
        sending);
  }
  void add(const detail::Buffer& data, int peer, int tag, bool sending);
  bool needs_fence() const;
  std::vector<Request> post_entries(void* stream);

  const Group& group_;
  Matching matching_;
  std::vector<Entry> entries_;
};

} // namespace cubelm::comm
