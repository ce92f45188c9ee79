#include "cubelm/comm/devices.hpp"

#include <algorithm>
#include <map>
#include <utility>

namespace cubelm::comm {

std::vector<SharedDevice> shared_devices(const std::vector<DeviceKey>& ranks) {
  // (node, bus id) -> the ranks on that GPU, in rank order.
  std::map<std::pair<int, std::string>, std::vector<int>> by_device;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    if (!ranks[r].device.empty())
      by_device[{ranks[r].node, ranks[r].device}].push_back(static_cast<int>(r));
  std::vector<SharedDevice> shared;
  for (auto& [key, members] : by_device) {
    if (members.size() < 2)
      continue;
    const DeviceKey& first = ranks[static_cast<std::size_t>(members.front())];
    SharedDevice s;
    s.node = key.first;
    s.node_name = first.node_name;
    s.device = key.second;
    s.ordinal = first.ordinal;
    s.ranks = std::move(members);
    shared.push_back(std::move(s));
  }
  std::sort(shared.begin(), shared.end(), [](const SharedDevice& a, const SharedDevice& b) {
    return a.ranks.front() < b.ranks.front();
  });
  return shared;
}

namespace {

std::string node_label(const SharedDevice& s) {
  return s.node_name.empty() ? "of rank " + std::to_string(s.node) : s.node_name;
}

std::string on_device(const SharedDevice& s) {
  std::string text = "ranks ";
  for (std::size_t i = 0; i < s.ranks.size(); ++i)
    text += (i > 0 ? "," : "") + std::to_string(s.ranks[i]);
  return text + " on GPU " + (s.ordinal >= 0 ? std::to_string(s.ordinal) : s.device);
}

} // namespace

std::string describe_shared_devices(const std::vector<SharedDevice>& shared, bool gpu_aware_mpi) {
  if (shared.empty())
    return {};
  std::size_t fewest = shared.front().ranks.size(), most = fewest;
  std::vector<int> nodes;
  for (const SharedDevice& s : shared) {
    fewest = std::min(fewest, s.ranks.size());
    most = std::max(most, s.ranks.size());
    if (std::find(nodes.begin(), nodes.end(), s.node) == nodes.end())
      nodes.push_back(s.node);
  }
  std::string line =
      "cubelm: " + std::to_string(fewest) + (most > fewest ? " to " + std::to_string(most) : "") +
      " ranks share " +
      (shared.size() == 1 ? "a GPU" : "each of " + std::to_string(shared.size()) + " GPUs") +
      " on " +
      (nodes.size() == 1 ? "node " + node_label(shared.front())
                         : std::to_string(nodes.size()) + " nodes") +
      " (";
  constexpr std::size_t listed = 4;
  for (std::size_t i = 0; i < shared.size() && i < listed; ++i) {
    const bool new_node = i == 0 || shared[i].node != shared[i - 1].node;
    if (i > 0)
      line += new_node && nodes.size() > 1 ? "; " : ", ";
    if (new_node && nodes.size() > 1)
      line += "node " + node_label(shared[i]) + ": ";
    line += on_device(shared[i]);
  }
  if (shared.size() > listed)
    line += "; " + std::to_string(shared.size() - listed) + " more";
  return line + "): groups spanning them use " +
         (gpu_aware_mpi ? "GPU-aware MPI" : "MPI through host memory") + " instead of NCCL";
}

} // namespace cubelm::comm
