#include "cubelm/comm/traffic.hpp"

namespace cubelm::comm {

const char* kind_name(Kind kind) {
  switch (kind) {
  case Kind::all_reduce:
    return "all_reduce";
  case Kind::all_gather:
    return "all_gather";
  case Kind::reduce_scatter:
    return "reduce_scatter";
  case Kind::broadcast:
    return "broadcast";
  case Kind::reduce:
    return "reduce";
  case Kind::send:
    return "send";
  case Kind::recv:
    return "recv";
  case Kind::all_to_all:
    return "all_to_all";
  }
  return "unknown";
}

double modeled_bytes_sent(Kind kind, int group_size, double message_bytes) {
  const double p = group_size;
  switch (kind) {
  case Kind::all_reduce:
    return 2.0 * (p - 1.0) * message_bytes / p;
  case Kind::all_gather:
  case Kind::reduce_scatter:
    return (p - 1.0) * message_bytes;
  case Kind::broadcast:
  case Kind::reduce:
    return (p - 1.0) * message_bytes / p;
  case Kind::send:
  case Kind::all_to_all: // the message is what goes to the other ranks
    return message_bytes;
  case Kind::recv:
    return 0.0;
  }
  return 0.0;
}

void TrafficCounters::add(const std::string& group, Kind kind, double bytes) {
  Cell& cell = cells_[{group, kind}];
  cell.calls += 1;
  cell.bytes += bytes;
}

double TrafficCounters::bytes(const std::string& group, Kind kind) const {
  const auto it = cells_.find({group, kind});
  return it == cells_.end() ? 0.0 : it->second.bytes;
}

double TrafficCounters::bytes(const std::string& group) const {
  double sum = 0.0;
  for (const auto& [key, cell] : cells_)
    if (key.first == group)
      sum += cell.bytes;
  return sum;
}

double TrafficCounters::total_bytes() const {
  double sum = 0.0;
  for (const auto& entry : cells_)
    sum += entry.second.bytes;
  return sum;
}

std::uint64_t TrafficCounters::calls(const std::string& group, Kind kind) const {
  const auto it = cells_.find({group, kind});
  return it == cells_.end() ? 0 : it->second.calls;
}

std::vector<TrafficEntry> TrafficCounters::entries() const {
  std::vector<TrafficEntry> rows;
  rows.reserve(cells_.size());
  for (const auto& [key, cell] : cells_)
    rows.push_back({key.first, key.second, cell.calls, cell.bytes});
  return rows;
}

} // namespace cubelm::comm
