#include "cubelm/comm/batch.hpp"

#include "cubelm/comm/watchdog.hpp"

#include "staged.hpp"

#include <memory>
#include <utility>

namespace cubelm::comm {

void Batch::add(const detail::Buffer& data, int peer, int tag, bool sending) {
  const char* what = sending ? "isend" : "irecv";
  group_.check_peer(peer, what);
  const Group::Route route = group_.route_for(data.host, matching_ == Matching::in_order);
  const detail::Staged buf(data, group_.staging_, route == Group::Route::staged, false);
  Entry e;
  e.transfer.send = sending;
  e.transfer.data = buf.data();
  e.transfer.count = data.count;
  e.transfer.type = data.type;
  e.transfer.peer = peer;
  e.transfer.tag = matching_ == Matching::in_order ? kInOrderTag : tag;
  e.route = route;
  e.bytes = data.count * data.element_bytes;
  if (sending && route == Group::Route::staged)
    e.copy_in = [buf] { buf.copy_in(); };
  e.finish = [buf, sending] { // holds the View until completion
    if (!sending)
      buf.copy_back();
  };
  entries_.push_back(std::move(e));
}

bool Batch::needs_fence() const {
  for (const Entry& e : entries_)
    if (e.route != Group::Route::nccl)
      return true;
  return false;
}

std::vector<Request> Batch::post_entries(void* stream) {
  std::vector<Entry> entries = std::move(entries_);
  entries_.clear();
  for (const Entry& e : entries) {
    group_.account(e.transfer.send ? Kind::send : Kind::recv, e.bytes);
    if (e.copy_in)
      e.copy_in();
  }
  // One call per backend: MPI for everything not on NCCL (the MPI backend serves
  // host memory, staged copies and GPU-aware device pointers alike), one NCCL group.
  std::vector<std::unique_ptr<PendingOp>> ops(entries.size());
  for (const bool nccl : {false, true}) {
    std::vector<Transfer> transfers;
    std::vector<std::size_t> at;
    for (std::size_t i = 0; i < entries.size(); ++i)
      if ((entries[i].route == Group::Route::nccl) == nccl) {
        transfers.push_back(entries[i].transfer);
        at.push_back(i);
      }
    if (transfers.empty())
      continue;
    // Posting may wait inside the library (NCCL connects peers on first use).
    const watchdog::Scope waiting(group_.watch_name_, "exchange");
    Backend& backend = group_.backend(nccl ? Group::Route::nccl : Group::Route::host);
    std::vector<std::unique_ptr<PendingOp>> started = backend.start_batch(transfers, stream);
    CUBELM_ASSERT(started.size() == transfers.size(),
                  "a backend started " + std::to_string(started.size()) + " of " +
                      std::to_string(transfers.size()) + " transfers");
    for (std::size_t k = 0; k < at.size(); ++k)
      ops[at[k]] = std::move(started[k]);
  }
  std::vector<Request> out;
  out.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i)
    out.emplace_back(std::move(ops[i]), std::move(entries[i].finish), group_.watch_name_,
                     entries[i].transfer.send ? "isend" : "irecv");
  return out;
}

} // namespace cubelm::comm
