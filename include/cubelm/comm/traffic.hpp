#pragma once
/// \file
/// \brief Counters of the bytes each rank sends, per group and per collective kind.
///
/// The counts follow one documented cost model (docs/communication.md), not
/// what a particular MPI library happens to do, so that perf runs can compare
/// the tensor-parallel modes with each other and with closed forms:
///   all_reduce     2 (p-1)/p · B   (ring: reduce-scatter then all-gather)
///   all_gather     (p-1) · B       (B = bytes this rank contributes)
///   reduce_scatter (p-1) · B       (B = bytes this rank receives)
///   broadcast      (p-1)/p · B     (pipelined/ring broadcast, mean per rank)
///   reduce         (p-1)/p · B     (mirror image of broadcast)
///   send           B;  recv 0
///   all_to_all     B               (B = bytes this rank sends to the other ranks;
///                                   its own block stays local)
/// where p is the group size and B the message size in bytes.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cubelm::comm {

/// \brief The kinds of communication that are counted.
enum class Kind {
  all_reduce,
  all_gather,
  reduce_scatter,
  broadcast,
  reduce,
  send,
  recv,
  all_to_all
};

/// \brief "all_reduce", "all_gather", ...
const char* kind_name(Kind kind);

/// \brief Bytes one rank sends for one operation of `kind` on a group of `group_size`
/// ranks with a message of `message_bytes` (see the table above).
double modeled_bytes_sent(Kind kind, int group_size, double message_bytes);

/// \brief One row of the counters.
struct TrafficEntry {
  std::string group;
  Kind kind;
  std::uint64_t calls = 0;
  double bytes = 0.0;
};

/// \brief Per-process tally of collective calls and modelled bytes sent.
class TrafficCounters {
public:
  /// \brief Records one call of `kind` on `group` that sent `bytes`.
  void add(const std::string& group, Kind kind, double bytes);

  double bytes(const std::string& group, Kind kind) const;
  /// \brief All kinds on one group.
  double bytes(const std::string& group) const;
  double total_bytes() const;
  std::uint64_t calls(const std::string& group, Kind kind) const;

  /// \brief Every (group, kind) seen, sorted by group then kind.
  std::vector<TrafficEntry> entries() const;
  void reset() { cells_.clear(); }

private:
  struct Cell {
    std::uint64_t calls = 0;
    double bytes = 0.0;
  };
  std::map<std::pair<std::string, Kind>, Cell> cells_;
};

} // namespace cubelm::comm
